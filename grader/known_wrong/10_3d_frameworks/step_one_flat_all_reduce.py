# replaces: step_3d
# loses: test_step_3d_traffic
# mistake: all-reduces one flattened buffer of every gradient instead of one all_reduce per tensor (right values, not the contract the cost model counts)
# nightly: one more 8-rank 3D step; step_reduces_over_tp proves test_step_3d and test_step_3d_traffic on every push
def step_3d(shards, micro_batches, targets, pp_group, dp_group, tp_group):
    """One PP x DP x TP training step on this rank (1F1B over pp_group, Megatron blocks over tp_group,
    gradients averaged over dp_group). Returns this replica's loss on the last stage, None elsewhere."""
    stage = dist.get_group_rank(pp_group, dist.get_rank())
    stages = dist.get_world_size(pp_group)
    prev = dist.get_global_rank(pp_group, stage - 1) if stage > 0 else None
    nxt = dist.get_global_rank(pp_group, stage + 1) if stage < stages - 1 else None
    m = len(micro_batches)
    stored, in_flight = {}, []
    total = 0.0

    def forward(i):
        nonlocal total
        if prev is None:
            x = micro_batches[i]
        else:
            x = torch.empty_like(micro_batches[i])
            dist.recv(x, prev)
            x.requires_grad_()
        out = x
        for w1, b1, w2, b2 in shards:
            out = out + tp_mlp(out, w1, b1, w2, b2, tp_group)
        if nxt is None:
            out = F.mse_loss(out, targets[i]) / m
            total += out.item()
        else:
            send = out.detach()
            in_flight.append((dist.isend(send, nxt), send))
        stored[i] = (x, out)

    def backward(i):
        x, out = stored.pop(i)
        if nxt is None:
            out.backward()
        else:
            grad = torch.empty_like(out)
            dist.recv(grad, nxt)
            out.backward(grad)
        if prev is not None:
            in_flight.append((dist.isend(x.grad, prev), x.grad))

    warmup = min(stages - 1 - stage, m)
    for i in range(warmup):
        forward(i)
    for i in range(m - warmup):
        forward(warmup + i)
        backward(i)
    for i in range(m - warmup, m):
        backward(i)
    for request, _ in in_flight:
        request.wait()

    dp = dist.get_world_size(dp_group)
    grads = [p.grad for block in shards for p in block]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=dp_group)
    flat /= dp
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()
    return total if nxt is None else None
