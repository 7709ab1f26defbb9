# replaces: zero_memory_bytes
# loses: test_zero_memory_bytes
# mistake: forgets the fp32 master copy of the weights: Adam state counted as m + v = 8 bytes, so 12 bytes/param
WEIGHT_BYTES = 2      # fp16/bf16 weights
GRAD_BYTES = 2        # fp16/bf16 gradients
OPTIMIZER_BYTES = 8   # Adam m (4) + Adam v (4)


def zero_memory_bytes(num_params, world_size, stage):
    psi, n = num_params, world_size
    if stage == 0:
        return (WEIGHT_BYTES + GRAD_BYTES + OPTIMIZER_BYTES) * psi
    if stage == 1:
        return (WEIGHT_BYTES + GRAD_BYTES) * psi + OPTIMIZER_BYTES * psi / n
    if stage == 2:
        return WEIGHT_BYTES * psi + (GRAD_BYTES + OPTIMIZER_BYTES) * psi / n
    if stage == 3:
        return (WEIGHT_BYTES + GRAD_BYTES + OPTIMIZER_BYTES) * psi / n
    raise ValueError(f"stage must be 0, 1, 2 or 3, got {stage!r}")
