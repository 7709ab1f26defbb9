# replaces: sign_hook
# loses: test_sign_hook
# mistake: compresses the raw gradient every step and forgets what the compression dropped (no error feedback)
def sign_hook(state, bucket):
    # 1-bit compression with error feedback: send ceil(n/8) bytes of signs + one fp32 scale per bucket.
    g = bucket.buffer()
    n, world, key = g.numel(), dist.get_world_size(), bucket.index()
    p = g.clone()
    scale = p.abs().mean()
    signs = p >= 0
    c = torch.where(signs, scale, -scale)
    # one message per rank: the packed signs, then the fp32 scale's 4 bytes (one all-gather, one latency)
    message = torch.cat([pack_bits(signs), scale.reshape(1).to(torch.float32).view(torch.uint8)])
    messages = [torch.empty_like(message) for _ in range(world)]
    dist.all_gather(messages, message)
    averaged = torch.zeros_like(g)
    for m in messages:
        scale_r = m[-4:].view(torch.float32).to(g.dtype)
        averaged += torch.where(unpack_bits(m[:-4], n), scale_r, -scale_r)
    averaged /= world
    fut = torch.futures.Future()
    fut.set_result(averaged)
    return fut
