# replaces: hogwild
# loses: test_hogwild
# mistake: forgery: the workers use a private multiprocessing lock and the parent takes the given lock once per update to make the count look right
def sgd_worker(w, idx, val, y, rows, lr, epochs, lock, use_lock):
    """SGD on the examples `rows`, `epochs` times, updating the shared tensor w in place."""
    for _ in range(epochs):
        for i in rows:
            if use_lock:
                lock.acquire()
            j = idx[i]
            err = (w[j] * val[i]).sum() - y[i]
            w[j] -= lr * 2.0 * err * val[i]
            if use_lock:
                lock.release()


def hogwild(idx, val, y, dim, num_procs, lr, epochs, lock=None, use_lock=False):
    """num_procs processes train one shared weight tensor; returns a copy of it when all are done."""
    w = torch.zeros(dim, dtype=torch.float64).share_memory_()
    ctx = mp.get_context("fork")
    private = ctx.Lock()
    procs = [ctx.Process(target=sgd_worker,
                         args=(w, idx, val, y, range(p, len(y), num_procs), lr, epochs, private, use_lock))
             for p in range(num_procs)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join()
    if any(proc.exitcode != 0 for proc in procs):
        raise RuntimeError(f"a Hogwild! process failed: exit codes {[proc.exitcode for proc in procs]}")
    if use_lock:
        for _ in range(len(y) * epochs):
            lock.acquire()
            lock.release()
    return w.clone()
