# replaces: rank_arithmetic
# loses: test_rank_arithmetic
# mistake: multiplies the node rank by the local rank instead of by the workers per node (every local rank 0 is rank 0)
def global_rank(node_rank, local_rank, nproc_per_node):
    """RANK of worker `local_rank` on node `node_rank`, when every node runs `nproc_per_node` workers."""
    return node_rank * local_rank


def node_of(rank, nproc_per_node):
    """GROUP_RANK (node rank) of the node that runs global rank `rank`."""
    return rank // nproc_per_node


def local_rank_of(rank, nproc_per_node):
    """LOCAL_RANK of global rank `rank` on its node."""
    return rank % nproc_per_node


def world_size_of(nnodes, nproc_per_node):
    """WORLD_SIZE of a job of `nnodes` nodes with `nproc_per_node` workers each."""
    return nnodes * nproc_per_node
