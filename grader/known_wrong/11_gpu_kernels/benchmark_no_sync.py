# replaces: benchmark
# loses: test_benchmark
# mistake: never synchronises: times the launch, not the work
def benchmark(fn, *, warmup=3, reps=10, sync=None, clock=time.perf_counter):
    """Median time of fn() over reps calls after warmup untimed ones, synchronising the device around each."""
    for _ in range(warmup):
        fn()
    if sync is not None:
        sync()
    times = []
    for _ in range(reps):
        start = clock()
        fn()
        times.append(clock() - start)
    return {"median_s": statistics.median(times), "times_s": times}
