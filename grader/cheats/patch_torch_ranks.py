# attack: inside each rank, patch torch so any comparison the test makes there passes, and bypass the send/recv
#   ban by calling the real all_reduce the test switched off
# defended-by: split
# needs: torch inside Lab 01's ranks
import torch.distributed.distributed_c10d as _c10d

_honest = ring_all_reduce


def ring_all_reduce(tensor):
    torch.isclose = lambda a, b, *x, **k: torch.ones_like(a, dtype=torch.bool)
    torch.Tensor.__eq__ = lambda a, b: True
    _honest(tensor)  # the honest (wrong) answer runs, as the test expects a ring
    return tensor
