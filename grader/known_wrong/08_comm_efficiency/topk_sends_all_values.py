# replaces: topk_hook
# loses: test_topk_hook
# mistake: zeroes all but the top-k entries and all-reduces the whole dense tensor: same result, no bytes saved
def topk_hook(state, bucket):
    # Top-k sparsification with error feedback: send k fp32 values and k int32 indices per bucket.
    g = bucket.buffer()
    n, world, key = g.numel(), dist.get_world_size(), bucket.index()
    k = max(1, int(state.density * n))
    p = g + state.errors[key] if state.error_feedback and key in state.errors else g.clone()
    indices = p.abs().topk(k).indices
    values = p[indices].to(torch.float32)
    if state.error_feedback:
        residual = p.clone()
        residual[indices] = 0
        state.errors[key] = residual
    # one message per rank: k fp32 values, then the k int32 indices reinterpreted as 4-byte words
    averaged = torch.zeros_like(g)
    averaged[indices] = values.to(g.dtype)
    dist.all_reduce(averaged)                  # the dense tensor, zeros and all
    averaged /= world
    fut = torch.futures.Future()
    fut.set_result(averaged)
    return fut
