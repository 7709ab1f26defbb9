# replaces: allreduce_calls_per_step
# loses: test_allreduce_calls_per_step
# mistake: all-reduces the hook count, so every rank reports the calls of all ranks summed (world_size times too many) instead of the all-reduces its own step launches
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
    train_step(model, opt, x, y)
    calls, times = 0, []
    for _ in range(steps):
        t0 = time.perf_counter()
        train_step(model, opt, x, y)
        times.append(time.perf_counter() - t0)
    total = torch.tensor([calls // steps])
    dist.all_reduce(total)  # "the number of all-reduce calls in the job"
    return {"calls_per_step": int(total.item()), "step_time_s": statistics.median(times)}
