# replaces: traffic_3d
# loses: test_traffic_3d
# mistake: counts the whole hidden width in the DP shard instead of hidden / tp
def traffic_3d(stage, pp, dp, tp, m, micro_batch_size, dim, hidden, blocks_per_stage):
    """Messages/collectives and bytes one rank of pipeline stage `stage` sends per dimension in one step_3d."""
    act = 4 * micro_batch_size * dim
    L = blocks_per_stage
    sends = m * (stage < pp - 1) + m * (stage > 0)
    tp_calls = m * L + m * (L - (stage == 0))
    shard = 2 * hidden * dim + hidden + dim
    return {"pp": [sends, sends * act], "tp": [tp_calls, tp_calls * act], "dp": [4 * L, 4 * L * shard]}
