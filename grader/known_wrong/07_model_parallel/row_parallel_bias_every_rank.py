# replaces: tp_mlp
# loses: test_tp_mlp
# mistake: row-parallel layer adds its bias on every rank before the all-reduce, so the bias is summed P times
def tp_mlp(x, w1, b1, w2, b2, group=None):
    """Column-parallel Linear + GeLU, then row-parallel Linear: this rank's shards in, the full output out."""
    h = F.gelu(F.linear(copy_to_tp(x, group), w1, b1))   # this rank's h/P hidden features, no communication
    partial = F.linear(h, w2)                             # this rank's share of the output, without the bias
    return reduce_from_tp(partial + b2, group)            # the one all-reduce; the bias once, after it
