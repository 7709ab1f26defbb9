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
    packed = pack_bits(signs)
    all_packed = [torch.empty_like(packed) for _ in range(world)]
    dist.all_gather(all_packed, packed)
    scale_t = scale.reshape(1).to(torch.float32)
    all_scales = [torch.empty_like(scale_t) for _ in range(world)]
    dist.all_gather(all_scales, scale_t)
    averaged = torch.zeros_like(g)
    for packed_r, scale_r in zip(all_packed, all_scales):
        averaged += torch.where(unpack_bits(packed_r, n), scale_r, -scale_r)
    averaged /= world
    fut = torch.futures.Future()
    fut.set_result(averaged)
    return fut
