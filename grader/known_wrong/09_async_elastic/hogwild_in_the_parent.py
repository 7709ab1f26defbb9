# replaces: hogwild
# loses: test_hogwild
# mistake: runs the workers one after another in the calling process, no processes
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
    procs = [ctx.Process(target=sgd_worker,
                         args=(w, idx, val, y, range(p, len(y), num_procs), lr, epochs, lock, use_lock))
             for p in range(num_procs)]
    for p in range(num_procs):
        sgd_worker(w, idx, val, y, range(p, len(y), num_procs), lr, epochs, lock, use_lock)
    return w.clone()
