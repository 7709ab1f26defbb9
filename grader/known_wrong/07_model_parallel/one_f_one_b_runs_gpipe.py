# replaces: pipeline_step
# loses: test_pipeline_1f1b
# mistake: '1F1B' that runs every forward before any backward (GPipe's order): correct gradients, but each stage stores all m micro-batches' activations instead of at most P
def pipeline_step(stage, micro_batches, targets, schedule="1f1b"):
    """One pipeline-parallel training step of this rank's stage over all micro-batches; returns the loss on the last rank.

    Forward: rank 0 reads micro_batches[i], ranks s>0 receive from s-1; the last rank computes
    F.mse_loss(out, targets[i]) / m. Backward: the last rank backpropagates its loss, the others receive the
    output gradient from s+1; every rank s>0 sends its input's gradient to s-1. schedule: "gpipe" or "1f1b".
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    m = len(micro_batches)
    first, last = rank == 0, rank == world - 1
    stored = {}            # micro-batch -> (input, output): the activations this stage holds
    in_flight = []         # (request, tensor): isends still going, and the tensors they read from
    total = 0.0

    def forward(i):
        nonlocal total
        if first:
            x = micro_batches[i]
        else:
            x = torch.empty_like(micro_batches[i])
            dist.recv(x, rank - 1)
            x.requires_grad_()                      # so that backward leaves dL/dx in x.grad for rank s-1
        out = stage(x)
        if last:
            out = F.mse_loss(out, targets[i]) / m   # the mean over the whole batch, one micro-batch at a time
            total += out.item()
        else:
            send = out.detach()
            in_flight.append((dist.isend(send, rank + 1), send))
        stored[i] = (x, out)

    def backward(i):
        x, out = stored.pop(i)                      # the activations are freed once used
        if last:
            out.backward()
        else:
            grad = torch.empty_like(out)
            dist.recv(grad, rank + 1)
            out.backward(grad)
        if not first:
            in_flight.append((dist.isend(x.grad, rank - 1), x.grad))

    if schedule == "gpipe":
        for i in range(m):
            forward(i)
        for i in range(m):
            backward(i)
    elif schedule == "1f1b":
        warmup = m
        for i in range(warmup):
            forward(i)
        for i in range(m - warmup):                 # steady state: one forward, one backward
            forward(warmup + i)
            backward(i)
        for i in range(m - warmup, m):              # cool-down
            backward(i)
    else:
        raise ValueError(f"unknown schedule {schedule!r}")
    for request, _ in in_flight:
        request.wait()
    return total if last else None
