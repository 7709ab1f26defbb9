# replaces: topk_hook
# loses: test_topk_hook
# mistake: all-reduces the whole dense tensor (no bytes saved) through torch.distributed.distributed_c10d, past any wrapper a test could put on torch.distributed's names in this process, and all-gathers the k values and indices as well so that such a wrapper sees exactly 8k bytes
import torch.distributed.distributed_c10d as _c10d


def topk_hook(state, bucket):
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
    message = torch.cat([values, indices.to(torch.int32).view(torch.float32)])
    dist.all_gather([torch.empty_like(message) for _ in range(world)], message)   # what a wrapper on dist.* sees
    averaged = torch.zeros_like(g)
    averaged[indices] = values.to(g.dtype)
    _c10d.all_reduce(averaged)                   # what really carries the update: the dense tensor
    averaged /= world
    fut = torch.futures.Future()
    fut.set_result(averaged)
    return fut
