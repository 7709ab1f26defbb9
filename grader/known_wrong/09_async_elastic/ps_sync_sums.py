# replaces: parameter_server
# loses: test_ps_sync
# mistake: the synchronous server sums the N gradients instead of averaging them
def ps_sync(X, y, steps, lr):
    """Synchronous parameter server: rank 0 averages all N workers' gradients every round."""
    rank, world = dist.get_rank(), dist.get_world_size()
    n_workers = world - 1
    w = torch.zeros(X.shape[1], dtype=torch.float64)
    if rank == 0:
        weights = []
        for _ in range(steps):
            for k in range(1, world):
                dist.send(w, k)
            total = torch.zeros_like(w)
            for k in range(1, world):
                g = torch.empty_like(w)
                dist.recv(g, k)
                total += g
            w = w - lr * total
            weights.append(w.clone())
        return {"weights": weights, "staleness": [0] * steps}
    Xk, yk = worker_shard(X, y, rank, n_workers)
    for _ in range(steps):
        dist.recv(w, 0)
        dist.send(mse_grad(w, Xk, yk), 0)
    return None


def ps_async(X, y, schedule, lr, staleness_lr=False):
    """Asynchronous parameter server for a given arrival schedule; returns weights and staleness on rank 0."""
    rank, world = dist.get_rank(), dist.get_world_size()
    n_workers = world - 1
    w = torch.zeros(X.shape[1], dtype=torch.float64)
    if rank == 0:
        remaining = collections.Counter(schedule)
        version, pulled = 0, {}
        for k in sorted(remaining):
            dist.send(w, k)
            pulled[k] = 0
        weights, staleness = [], []
        for k in schedule:
            g = torch.empty_like(w)
            dist.recv(g, k)
            tau = version - pulled[k]
            step_lr = lr / max(1, tau) if staleness_lr else lr
            w = w - step_lr * g
            version += 1
            weights.append(w.clone())
            staleness.append(tau)
            remaining[k] -= 1
            if remaining[k] > 0:
                dist.send(w, k)
                pulled[k] = version
        return {"weights": weights, "staleness": staleness}
    Xk, yk = worker_shard(X, y, rank, n_workers)
    for _ in range(list(schedule).count(rank)):
        dist.recv(w, 0)
        dist.send(mse_grad(w, Xk, yk), 0)
    return None
