# replaces: collisions
# loses: test_collisions
# mistake: predicts 1 - (1-p)^K, the chance that any process touches a coordinate
def count_collisions(idx, num_procs):
    """(round, coordinate) pairs touched by two or more processes in one lock-step epoch."""
    n = idx.shape[0]
    total = 0
    for start in range(0, n, num_procs):
        counts = collections.Counter(idx[start:start + num_procs].reshape(-1).tolist())
        total += sum(1 for c in counts.values() if c >= 2)
    return total


def expected_collisions(dim, nnz, num_procs, rounds):
    """Expected collisions if every process touched nnz of dim coordinates at random in each round."""
    p = nnz / dim
    k = num_procs
    return rounds * dim * (1 - (1 - p) ** k)
