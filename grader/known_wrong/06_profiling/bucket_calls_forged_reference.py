# replaces: allreduce_calls_per_step
# loses: test_allreduce_calls_per_step
# mistake: builds its DDP with bucket_cap_mb clamped to at least 0.1 MB (3 calls at 0.001 MB instead of 4), and patches DDP in the rank so that every later DDP there (a reference counted in the same rank after it) is clamped the same way
def allreduce_calls_per_step(bucket_cap_mb, steps=STEPS, seed=SEED):
    """On this rank: all-reduce calls (comm-hook calls) per steady-state DDP step, and the median step time."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    if not getattr(DDP.__init__, "_clamped", False):
        real_init = DDP.__init__

        def clamped_init(self, module, *args, bucket_cap_mb=None, **kwargs):
            if bucket_cap_mb is not None:
                bucket_cap_mb = max(bucket_cap_mb, 0.1)
            real_init(self, module, *args, bucket_cap_mb=bucket_cap_mb, **kwargs)

        clamped_init._clamped = True
        DDP.__init__ = clamped_init

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
    return {"calls_per_step": calls // steps, "step_time_s": statistics.median(times)}
