# replaces: allreduce_calls_per_step
# loses: test_allreduce_calls_per_step
# mistake: never resets the hook-call count after the warm-up step, so the warm-up's calls leak into the average
def allreduce_calls_per_step(bucket_cap_mb, steps=STEPS, seed=SEED):
    """On this rank: all-reduce calls (comm-hook calls) per steady-state DDP step, and the median step time."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    rank, world_size = dist.get_rank(), dist.get_world_size()
    model = ddp_model(bucket_cap_mb, seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = batch_for(rank, world_size, seed=seed)
    calls = 0

    def counting_hook(state, bucket):
        nonlocal calls
        calls += 1
        return default_hooks.allreduce_hook(state, bucket)

    model.register_comm_hook(state=None, hook=counting_hook)
    train_step(model, opt, x, y)  # warm-up: buckets are rebuilt after the first backward
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        train_step(model, opt, x, y)
        times.append(time.perf_counter() - t0)
    return {"calls_per_step": calls // steps, "step_time_s": statistics.median(times)}
