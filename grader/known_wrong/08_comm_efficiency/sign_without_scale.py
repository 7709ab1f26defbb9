# replaces: sign_hook
# loses: test_sign_hook
# mistake: sends only the signs and decodes them as +1 / -1: no scale, so every update has the wrong size
def sign_hook(state, bucket):
    # 1-bit compression with error feedback: send ceil(n/8) bytes of signs + one fp32 scale per bucket.
    g = bucket.buffer()
    n, world, key = g.numel(), dist.get_world_size(), bucket.index()
    p = g + state.errors[key] if state.error_feedback and key in state.errors else g.clone()
    scale = p.abs().mean()
    signs = p >= 0
    c = torch.where(signs, 1.0, -1.0)
    if state.error_feedback:
        state.errors[key] = p - c
    packed = pack_bits(signs)
    all_packed = [torch.empty_like(packed) for _ in range(world)]
    dist.all_gather(all_packed, packed)
    averaged = torch.zeros_like(g)
    for packed_r in all_packed:
        averaged += torch.where(unpack_bits(packed_r, n), 1.0, -1.0)
    averaged /= world
    fut = torch.futures.Future()
    fut.set_result(averaged)
    return fut
