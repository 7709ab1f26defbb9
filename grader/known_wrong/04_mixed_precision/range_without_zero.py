# replaces: quantize_int8
# loses: test_quantize_int8
# mistake: takes the range from min/max without stretching it to include 0, so all-equal or one-signed tensors break
def quantize_int8(x):
    qmin, qmax = -128, 127
    lo, hi = x.min().item(), x.max().item()
    scale = (hi - lo) / (qmax - qmin)
    zero_point = int(min(max(qmin - round(lo / scale), qmin), qmax))
    q = torch.clamp(torch.round(x / scale) + zero_point, qmin, qmax).to(torch.int8)
    return q, scale, zero_point
