# replaces: quantize_int8
# loses: test_quantize_int8
# mistake: zero point computed with int() (truncation towards zero) instead of rounding to nearest
def quantize_int8(x):
    qmin, qmax = -128, 127
    lo = min(x.min().item(), 0.0)
    hi = max(x.max().item(), 0.0)
    scale = (hi - lo) / (qmax - qmin)
    if scale == 0.0:
        scale = torch.finfo(torch.float32).eps
    zero_point = int(min(max(qmin - int(lo / scale), qmin), qmax))
    q = torch.clamp(torch.round(x / scale) + zero_point, qmin, qmax).to(torch.int8)
    return q, scale, zero_point
