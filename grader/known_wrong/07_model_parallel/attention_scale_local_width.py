# replaces: tp_attention
# loses: test_tp_attention
# mistake: scales the attention scores by sqrt of this rank's whole width (heads x head_dim) instead of sqrt(head_dim)
def tp_attention(x, wq, wk, wv, wo, bo, heads, group=None):
    """Self-attention over this rank's `heads` heads; the full output (B, T, d) on every rank."""
    B, T, _ = x.shape
    head_dim = wq.shape[0] // heads
    x = copy_to_tp(x, group)

    def split(w):                                  # (B, T, heads*head_dim) -> (B, heads, T, head_dim)
        return F.linear(x, w).view(B, T, heads, head_dim).transpose(1, 2)

    q, k, v = split(wq), split(wk), split(wv)
    attn = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(heads * head_dim), dim=-1) @ v
    attn = attn.transpose(1, 2).reshape(B, T, heads * head_dim)
    return reduce_from_tp(F.linear(attn, wo), group) + bo
