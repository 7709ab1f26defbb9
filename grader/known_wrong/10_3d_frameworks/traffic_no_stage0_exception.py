# replaces: traffic_3d
# loses: test_traffic_3d
# mistake: counts 2mL TP all-reduces on stage 0 too (its first block's input needs no gradient)
def traffic_3d(stage, pp, dp, tp, m, micro_batch_size, dim, hidden, blocks_per_stage):
    """Messages/collectives and bytes one rank of pipeline stage `stage` sends per dimension in one step_3d."""
    act = 4 * micro_batch_size * dim
    L = blocks_per_stage
    sends = m * (stage < pp - 1) + m * (stage > 0)
    tp_calls = 2 * m * L
    shard = 2 * (hidden // tp) * dim + hidden // tp + dim
    return {"pp": [sends, sends * act], "tp": [tp_calls, tp_calls * act], "dp": [4 * L, 4 * L * shard]}
