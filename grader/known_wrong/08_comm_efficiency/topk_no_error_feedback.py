# replaces: topk_hook
# loses: test_topk_hook
# mistake: sends the top-k of the raw gradient every step and drops the rest for good (no error feedback)
def topk_hook(state, bucket):
    # Top-k sparsification with error feedback: send k fp32 values and k int32 indices per bucket.
    g = bucket.buffer()
    n, world, key = g.numel(), dist.get_world_size(), bucket.index()
    k = max(1, int(state.density * n))
    p = g.clone()
    indices = p.abs().topk(k).indices
    values = p[indices].to(torch.float32)
    # one message per rank: k fp32 values, then the k int32 indices reinterpreted as 4-byte words
    message = torch.cat([values, indices.to(torch.int32).view(torch.float32)])
    messages = [torch.empty_like(message) for _ in range(world)]
    dist.all_gather(messages, message)
    averaged = torch.zeros_like(g)
    for m in messages:
        averaged.index_add_(0, m[k:].view(torch.int32).long(), m[:k].to(g.dtype))
    averaged /= world
    fut = torch.futures.Future()
    fut.set_result(averaged)
    return fut
