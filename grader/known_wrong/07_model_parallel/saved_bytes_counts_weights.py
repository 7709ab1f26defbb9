# replaces: checkpoint
# loses: test_checkpointing
# mistake: counts every saved tensor, weights included, and a tensor saved twice twice: the weights are not activations
def saved_activation_bytes(fn, params):
    """(fn(), bytes of the distinct non-parameter storages autograd saved during fn())."""
    param_storages = {p.untyped_storage().data_ptr() for p in params}
    seen = {}

    def pack(t):
        storage = t.untyped_storage()
        seen[len(seen)] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sum(seen.values())


def checkpointed_forward(blocks, x, segments):
    """Run `blocks` in order on x; with segments > 0, as that many checkpointed pieces."""
    blocks = list(blocks)
    if segments == 0:
        for block in blocks:
            x = block(x)
        return x
    base, extra = divmod(len(blocks), segments)
    start = 0
    for s in range(segments):
        piece = blocks[start:start + base + (s < extra)]
        start += len(piece)

        def run(h, piece=piece):
            for block in piece:
                h = block(h)
            return h

        x = checkpoint(run, x, use_reentrant=False)
    return x
