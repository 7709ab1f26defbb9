# replaces: scaling_efficiency
# loses: test_scaling_efficiency
# mistake: divides the speedup by p instead of p / p_0, which is only right when the baseline has one rank (the visible tests use a one-rank baseline; a hidden test starts at two ranks)
def scaling_efficiency(world_sizes, throughputs, mode="strong"):
    """Parallel efficiency of each run against the first one (steps/s in, fractions out; see the contract)."""
    if mode not in ("strong", "weak"):
        raise ValueError(f"mode must be 'strong' or 'weak', got {mode!r}")
    world_sizes, throughputs = list(world_sizes), list(throughputs)
    if not world_sizes or len(world_sizes) != len(throughputs):
        raise ValueError("need one throughput per world size")
    if min(world_sizes) <= 0 or min(throughputs) <= 0:
        raise ValueError("world sizes and throughputs must be positive")
    x0 = throughputs[0]
    if mode == "strong":
        return [(x / x0) / p for p, x in zip(world_sizes, throughputs)]
    return [x / x0 for x in throughputs]
