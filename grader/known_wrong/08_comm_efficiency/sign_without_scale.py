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
    message = pack_bits(signs)
    messages = [torch.empty_like(message) for _ in range(world)]
    dist.all_gather(messages, message)
    averaged = torch.zeros_like(g)
    for m in messages:
        averaged += torch.where(unpack_bits(m, n), 1.0, -1.0)
    averaged /= world
    fut = torch.futures.Future()
    fut.set_result(averaged)
    return fut
