# replaces: elastic_train
# loses: test_elastic
# mistake: calls on_step (where a node may leave) before that step's checkpoint is written, so a node that leaves loses the step it just finished
def shard_rows(rows, rank, world):
    """This rank's contiguous share of rows: len(rows) // world each, one more for the first len(rows) % world ranks."""
    base, extra = divmod(len(rows), world)
    start = rank * base + min(rank, extra)
    return rows[start:start + base + (1 if rank < extra else 0)]


def train_elastic(cfg, on_step=None):
    """Least squares on global batches, resumable on any world size; returns w."""
    rank, world = dist.get_rank(), dist.get_world_size()
    X, y = regression_data(cfg["n"], cfg["dim"], cfg["seed"])
    w, start = torch.zeros(cfg["dim"], dtype=torch.float64), 0
    if os.path.exists(cfg["ckpt_path"]):
        state = torch.load(cfg["ckpt_path"])
        w, start = state["w"], int(state["step"])
    B = cfg["global_batch"]
    end = min(cfg["steps"], cfg.get("stop_at") or cfg["steps"])
    for step in range(start, end):
        mine = shard_rows(batch_rows(step, B, cfg["n"], cfg["seed"]), rank, world)
        Xi, yi = X[mine], y[mine]
        grad_sum = 2.0 * Xi.T @ (Xi @ w - yi)
        dist.all_reduce(grad_sum)
        w = w - cfg["lr"] * grad_sum / B
        if on_step is not None:
            on_step(step + 1)
        if (step + 1) % cfg["ckpt_every"] == 0 and rank == 0:
            tmp = cfg["ckpt_path"] + ".tmp"
            torch.save({"w": w, "step": step + 1}, tmp)
            os.replace(tmp, cfg["ckpt_path"])
    return w
