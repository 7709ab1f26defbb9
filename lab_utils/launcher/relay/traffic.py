"""``Traffic``: what tests read, every call the ranks of one or more launches made through the relay."""
from __future__ import annotations

import threading

from lab_utils.launcher.relay import collectives
from lab_utils.launcher.relay.api import Call
from lab_utils.launcher.relay.server import Relay


class Traffic:
    """What the ranks of one or more launches sent; pass it to ``launch(..., traffic=...)``.

    ``calls`` holds every call in the order the relay received it: a call is recorded when its frame arrives,
    before it is served, so each rank's own calls stay in the order the rank made them (an ``isend`` followed by a
    ``recv`` stays in that order even when the recv is answered first). ``count`` and ``bytes`` filter them by op,
    rank, group and peer.
    """

    def __init__(self, keep_data: bool = False):
        self.calls: list[Call] = []
        self.keep_data = keep_data  # keep what every send and collective carried, so a test can check its content
        self._lock = threading.Lock()

    def record(self, call: Call) -> None:
        with self._lock:
            self.calls.append(call)

    def clear(self) -> None:
        with self._lock:
            self.calls.clear()

    def select(self, op=None, rank=None, group=None, peer=None) -> list[Call]:
        group = tuple(group) if group is not None else None
        with self._lock:
            return [c for c in self.calls if (op is None or c.op == op) and (rank is None or c.rank == rank)
                    and (group is None or c.group == group) and (peer is None or c.peer == peer)]

    def count(self, op=None, rank=None, group=None, peer=None) -> int:
        return len(self.select(op, rank, group, peer))

    def bytes(self, op=None, rank=None, group=None, peer=None) -> int:
        return sum(c.nbytes for c in self.select(op, rank, group, peer))

    def tensor(self, call: Call):
        """What a send or a collective's caller handed over (``keep_data``), as a tensor of its dtype and shape."""
        return collectives.tensor(call.data, call.dtype, call.shape)

    def start(self, world_size: int, directory: str | None = None) -> Relay:
        """A relay for one launch of ``world_size`` ranks, listening in ``directory`` (a private temp folder by
        default; under grading, a folder the sandboxed ranks see at the same path)."""
        return Relay(self, world_size, directory)
