# replaces: FlashAttention
# loses: test_flash_autograd
# mistake: the backward calls flash_attention_backward without ctx.is_causal: causal gradients are the non-causal ones
class FlashAttention(torch.autograd.Function):
    """Attention whose forward is flash_attention_forward and whose backward recomputes P from L."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        o, lse = flash_attention_forward(q, k, v, is_causal)
        ctx.save_for_backward(q, k, v, o, lse)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = flash_attention_backward(q, k, v, o, lse, do)
        return dq, dk, dv, None
