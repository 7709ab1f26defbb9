# replaces: zero_memory_bytes
# loses: test_zero_memory_bytes
# mistake: counts the gradients as 4-byte fp32 instead of 2-byte fp16/bf16 (18 bytes per parameter, not 16)
WEIGHT_BYTES = 2      # fp16/bf16 weights
GRAD_BYTES = 4        # gradients "in fp32"
OPTIMIZER_BYTES = 12  # K: fp32 master copy (4) + Adam m (4) + Adam v (4)


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
