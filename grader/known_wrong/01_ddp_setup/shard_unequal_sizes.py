# replaces: shard_indices
# loses: test_shard_indices
# mistake: strides the permutation without padding it, so when n does not divide by the world size some ranks get one sample fewer (in DDP: one batch fewer, and the other ranks' last all-reduce waits forever)
def shard_indices(n, rank, world_size, epoch, seed=0):
    """Indices of range(n) that ``rank`` visits in ``epoch``: DistributedSampler's shuffle, padding and striding."""
    g = torch.Generator()
    g.manual_seed(seed + epoch)
    order = torch.randperm(n, generator=g).tolist()
    return order[rank::world_size]
