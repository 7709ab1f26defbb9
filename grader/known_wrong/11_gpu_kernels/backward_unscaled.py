# replaces: flash_attention_backward
# loses: test_flash_backward
# mistake: forgets the 1/sqrt(d) of the scores in dQ and dK
def flash_attention_backward(q, k, v, o, lse, do, is_causal=False):
    """(dq, dk, dv) of attention, with P recomputed from q, k and the saved log-sum-exp lse."""
    scale = 1 / math.sqrt(q.shape[-1])
    s = q @ k.transpose(-1, -2) * scale
    if is_causal:
        n_q, n_k = s.shape[-2:]
        keep = torch.arange(n_q, device=q.device)[:, None] >= torch.arange(n_k, device=q.device)[None, :]
        s = torch.where(keep, s, -1e6)
    p = torch.exp(s - lse[..., None])
    dv = p.transpose(-1, -2) @ do
    dp = do @ v.transpose(-1, -2)
    delta = (do * o).sum(dim=-1, keepdim=True)
    ds = p * (dp - delta)
    return ds @ k, ds.transpose(-1, -2) @ q, dv
