# replaces: scaling_efficiency
# loses: test_scaling_efficiency
# mistake: compares raw throughputs across runs instead of ratios to the baseline run (never divides by X_0), so the "efficiency" is in steps per second and changes with the machine, not a fraction of ideal
def scaling_efficiency(world_sizes, throughputs, mode="strong"):
    """Parallel efficiency of each run against the first one (steps/s in, fractions out; see the contract)."""
    if mode not in ("strong", "weak"):
        raise ValueError(f"mode must be 'strong' or 'weak', got {mode!r}")
    world_sizes, throughputs = list(world_sizes), list(throughputs)
    if not world_sizes or len(world_sizes) != len(throughputs):
        raise ValueError("need one throughput per world size")
    if min(world_sizes) <= 0 or min(throughputs) <= 0:
        raise ValueError("world sizes and throughputs must be positive")
    if mode == "strong":
        return [x / p for p, x in zip(world_sizes, throughputs)]
    return list(throughputs)
