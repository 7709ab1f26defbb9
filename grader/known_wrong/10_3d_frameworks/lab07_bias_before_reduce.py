# replaces: lab07_pieces
# loses: test_step_3d
# mistake: adds the row-parallel bias on every TP rank before the all-reduce
# nightly: one more 8-rank 3D step; step_reduces_over_tp proves test_step_3d and test_step_3d_traffic on every push
class _CopyToTP(torch.autograd.Function):
    """f: identity forward; all-reduce of the gradient backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    """g: all-reduce forward; identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        out = x.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def copy_to_tp(x, group=None):
    return _CopyToTP.apply(x, group)


def reduce_from_tp(x, group=None):
    return _ReduceFromTP.apply(x, group)


def tp_mlp(x, w1, b1, w2, b2, group=None):
    """Column-parallel Linear + GeLU, then row-parallel Linear: this rank's shards in, the full output out."""
    h = F.gelu(F.linear(copy_to_tp(x, group), w1, b1))
    return reduce_from_tp(F.linear(h, w2) + b2, group)
