# replaces: roofline
# loses: test_roofline
# mistake: divides the FLOPs by the elements moved, forgetting the bytes per element
def matmul_intensity(m, n, k, itemsize=4):
    """FLOPs per byte of C = A @ B (A: m x k, B: k x n) when A and B are read once and C written once."""
    flops = 2 * m * n * k
    moved = m * k + k * n + m * n
    return flops / moved


def attainable_flops(intensity, peak_flops, bandwidth):
    """The roofline: the FLOP rate a kernel of this intensity can reach at most (memory- or compute-bound)."""
    return min(peak_flops, intensity * bandwidth)
