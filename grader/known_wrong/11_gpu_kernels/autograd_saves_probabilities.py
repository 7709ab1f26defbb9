# replaces: FlashAttention
# loses: test_flash_autograd
# mistake: no recomputation: the forward computes P (N x N) in torch and saves it for the backward
class FlashAttention(torch.autograd.Function):
    """Attention whose forward is flash_attention_forward and whose backward recomputes P from L."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        o, lse = flash_attention_forward(q, k, v, is_causal)
        s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        if is_causal:
            s = torch.where(torch.ones_like(s, dtype=torch.bool).tril(), s, -1e6)
        ctx.save_for_backward(q, k, v, o, lse, torch.softmax(s, dim=-1))
        ctx.is_causal = is_causal
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse, p = ctx.saved_tensors
        scale = 1 / math.sqrt(q.shape[-1])
        dv = p.transpose(-1, -2) @ do
        ds = p * (do @ v.transpose(-1, -2) - (do * o).sum(-1, keepdim=True))
        dq, dk = ds @ k * scale, ds.transpose(-1, -2) @ q * scale
        return dq, dk, dv, None
