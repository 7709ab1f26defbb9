# replaces: topk_hook
# loses: test_topk_hook
# mistake: rounds k up (ceil(density * n)) instead of max(1, int(density * n)): one value too many per bucket
def topk_hook(state, bucket):
    # Top-k sparsification with error feedback: send k fp32 values and k int32 indices per bucket.
    g = bucket.buffer()
    n, world, key = g.numel(), dist.get_world_size(), bucket.index()
    k = math.ceil(state.density * n)
    p = g + state.errors[key] if state.error_feedback and key in state.errors else g.clone()
    indices = p.abs().topk(k).indices
    values = p[indices].to(torch.float32)
    if state.error_feedback:
        residual = p.clone()
        residual[indices] = 0
        state.errors[key] = residual
    idx32 = indices.to(torch.int32)
    all_values = [torch.empty_like(values) for _ in range(world)]
    all_indices = [torch.empty_like(idx32) for _ in range(world)]
    dist.all_gather(all_values, values)
    dist.all_gather(all_indices, idx32)
    averaged = torch.zeros_like(g)
    for v, i in zip(all_values, all_indices):
        averaged.index_add_(0, i.long(), v.to(g.dtype))
    averaged /= world
    fut = torch.futures.Future()
    fut.set_result(averaged)
    return fut
