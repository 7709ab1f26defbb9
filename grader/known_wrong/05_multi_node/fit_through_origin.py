# replaces: alpha_beta
# loses: test_alpha_beta
# mistake: fits t = beta * n through the origin, so there is no latency term (alpha = 0)
def fit_alpha_beta(sizes, times):
    """Least-squares (alpha, beta) of times ~ alpha + beta * sizes."""
    n = np.asarray(sizes, dtype=np.float64)
    t = np.asarray(times, dtype=np.float64)
    beta = float(n @ t / (n @ n))
    return 0.0, beta


def ring_allreduce_time(n, p, alpha, beta):
    """Ring all-reduce of n bytes on p ranks: 2(p-1) alpha + 2 (p-1)/p n beta."""
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * n * beta


def tree_allreduce_time(n, p, alpha, beta):
    """Tree all-reduce (reduce + broadcast) of n bytes on p ranks: 2 log2(p) (alpha + n beta)."""
    return 2 * math.log2(p) * (alpha + n * beta)
