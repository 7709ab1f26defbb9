# replaces: shard_indices
# loses: test_shard_indices
# mistake: seeds the shuffle with the seed alone and ignores the epoch (the hand-written version of forgetting sampler.set_epoch), so every epoch visits the same samples in the same order
def shard_indices(n, rank, world_size, epoch, seed=0):
    """Indices of range(n) that ``rank`` visits in ``epoch``: DistributedSampler's shuffle, padding and striding."""
    g = torch.Generator()
    g.manual_seed(seed)
    order = torch.randperm(n, generator=g).tolist()
    total = math.ceil(n / world_size) * world_size
    padding = total - n
    order += (order * math.ceil(padding / n))[:padding]
    return order[rank:total:world_size]
