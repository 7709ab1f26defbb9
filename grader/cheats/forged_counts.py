# attack: sum with the built-in all-reduce (taken before any test can switch it off), then forge the message counts a test keeps in the rank: walk up the stack and add the expected sends and bytes to every counter dict found there
# defended-by: split
# needs: the counters Lab 01's tests keep in its ranks
import sys as _sys

import torch.distributed as _dist
import torch.distributed.distributed_c10d as _c10d

_builtin_all_reduce = _c10d.all_reduce


def ring_all_reduce(tensor):
    world = _dist.get_world_size()
    _builtin_all_reduce(tensor)
    frame = _sys._getframe(1)
    while frame is not None:  # a test that counts in this process keeps a dict like {"sends": ..., "bytes": ...}
        for value in list(frame.f_locals.values()):
            if isinstance(value, dict) and "sends" in value and "bytes" in value:
                value["sends"] += 2 * (world - 1)
                value["bytes"] += 2 * (world - 1) * tensor.numel() // world * tensor.element_size()
        frame = frame.f_back
    return tensor
