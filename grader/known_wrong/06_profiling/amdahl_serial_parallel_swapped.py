# replaces: fit_amdahl
# loses: test_fit_amdahl
# mistake: inverts Amdahl's law with the fractions swapped, S = 1 / (f + (1 - f) / p), so it fits the serial fraction and returns 1 - f
def fit_amdahl(world_sizes, speedups):
    """Least-squares parallel fraction f of Amdahl's law S(p) = 1 / ((1 - f) + f / p)."""
    p = np.asarray(world_sizes, dtype=float)
    s = np.asarray(speedups, dtype=float)
    if p.shape != s.shape:
        raise ValueError("need one speedup per world size")
    if not np.any(p > 1):
        raise ValueError("fit_amdahl needs at least one run with more than one rank")
    # 1/S = f + (1 - f)/p  =>  1/S - 1/p = f (1 - 1/p)
    x = 1.0 - 1.0 / p
    y = 1.0 / s - 1.0 / p
    f = float(np.dot(x, y) / np.dot(x, x))
    return min(1.0, max(0.0, f))
