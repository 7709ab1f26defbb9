# replaces: FlashAttention
# loses: test_flash_autograd
# mistake: saves q, k, v and o only, and recomputes L with the N x N scores in the backward
class FlashAttention(torch.autograd.Function):
    """Attention whose forward is flash_attention_forward and whose backward recomputes P from L."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        o, lse = flash_attention_forward(q, k, v, is_causal)
        ctx.save_for_backward(q, k, v, o)
        ctx.is_causal = is_causal
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o = ctx.saved_tensors
        s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        if ctx.is_causal:
            s = torch.where(torch.ones_like(s, dtype=torch.bool).tril(), s, -1e6)
        lse = torch.logsumexp(s, dim=-1)
        dq, dk, dv = flash_attention_backward(q, k, v, o, lse, do, ctx.is_causal)
        return dq, dk, dv, None
