# replaces: benchmark
# loses: test_benchmark
# mistake: times the warm-up calls too
def benchmark(fn, *, warmup=3, reps=10, sync=None, clock=time.perf_counter):
    """Median time of fn() over reps calls after warmup untimed ones, synchronising the device around each."""
    times = []
    for _ in range(warmup + reps):
        start = clock()
        fn()
        if sync is not None:
            sync()
        times.append(clock() - start)
    return {"median_s": statistics.median(times), "times_s": times}
