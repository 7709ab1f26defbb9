# replaces: hogwild
# loses: test_hogwild
# mistake: the locked baseline holds the lock only around the write: w is read and the update computed outside it, so updates are still lost
def sgd_worker(w, idx, val, y, rows, lr, epochs, lock, use_lock):
    """SGD on the examples `rows`, `epochs` times, updating the shared tensor w in place."""
    for _ in range(epochs):
        for i in rows:
            j = idx[i]
            err = (w[j] * val[i]).sum() - y[i]
            step = lr * 2.0 * err * val[i]
            if use_lock:
                with lock:
                    w[j] -= step
            else:
                w[j] -= step


def hogwild(idx, val, y, dim, num_procs, lr, epochs, lock=None, use_lock=False):
    """num_procs processes train one shared weight tensor; returns a copy of it when all are done."""
    w = torch.zeros(dim, dtype=torch.float64).share_memory_()
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=sgd_worker,
                         args=(w, idx, val, y, range(p, len(y), num_procs), lr, epochs, lock, use_lock))
             for p in range(num_procs)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join()
    if any(proc.exitcode != 0 for proc in procs):
        raise RuntimeError(f"a Hogwild! process failed: exit codes {[proc.exitcode for proc in procs]}")
    return w.clone()
