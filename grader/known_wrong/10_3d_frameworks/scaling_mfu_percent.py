# replaces: compute_scaling
# loses: test_compute_scaling
# mistake: returns MFU in percent
def training_flops(num_params, num_tokens):
    """Training compute of a dense model: about 6 FLOPs per parameter per token (2 forward, 4 backward)."""
    return 6 * num_params * num_tokens


def mfu(num_params, tokens_per_step, step_seconds, peak_flops):
    """Model FLOPs utilisation of a measured step: achieved model FLOP/s over the hardware's peak (a fraction)."""
    return 100 * training_flops(num_params, tokens_per_step) / step_seconds / peak_flops


def chinchilla_optimal(compute_flops, tokens_per_param=20):
    """(N_opt, D_opt) for a compute budget C = 6 N D with D = tokens_per_param * N."""
    n = math.sqrt(compute_flops / (6 * tokens_per_param))
    return n, tokens_per_param * n


def training_days(num_params, num_tokens, num_devices, peak_flops_per_device, utilization):
    """Wall-clock days of a run of 6ND FLOPs on num_devices devices, each at `utilization` (its MFU) of its peak."""
    return training_flops(num_params, num_tokens) / (num_devices * peak_flops_per_device * utilization) / 86400
