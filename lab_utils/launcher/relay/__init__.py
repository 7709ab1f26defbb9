"""A process group whose every message passes through the launching process, which counts it: ``Traffic``.

Tests must count what a student's code sends (a ring's messages and bytes, the all-reduces of a backward pass,
the collectives on each mesh dimension), and a count taken inside a rank is the student's to forge: it runs in the
same process as their code. With ``launch(fn, ..., traffic=Traffic())`` the ranks join ``RelayGroup`` instead of
gloo or NCCL: a ``torch.distributed`` process group written in Python whose send, recv and collectives each go to a
relay thread in the launching process (under grading: the grader's kernel, outside the sandbox) over one Unix
socket per rank. The relay moves the bytes, computes the reductions itself and records each call in
``Traffic.calls``. A rank cannot make the relay see a message it did not send through it; code that moves data
over a channel of its own (a private gloo group, a file) is simply not counted, so tests ask for what the right
algorithm must send through it.

The relay reads only bounded JSON headers and raw tensor bytes of known dtypes (never a pickle), refuses frames
and buffers over its limits, and names mismatches (rank 0 in all_reduce while rank 1 is in broadcast, a recv
of the wrong size) in the error the ranks raise. Subgroups (``new_group``, ``DeviceMesh`` dimensions, DTensor's
collectives) go through it too; ``Call.group`` holds the global ranks of the group a call was made on.
Everything is CPU-side: CUDA tensors are copied through host memory, which is fine for tests, not for speed.

| module      | its one job                                                                                       |
|-------------|---------------------------------------------------------------------------------------------------|
| api         | what the parts share: limits, ``Call``, ``RelayError``, ``Endpoint`` (a relay in another process) |
| traffic     | ``Traffic``: the calls a test reads, and the relay it starts for a launch                         |
| server      | the relay: a thread per rank's connection, mailboxes for send/recv, collectives gathered          |
| collectives | pure functions on headers and bytes: a frame checked into a ``Call``, a collective's replies      |
| group       | the rank's side: ``RelayGroup`` (the ``dtrelay`` backend), its connection, ``join``               |

Every socket speaks ``lab_utils.launcher.wire``'s messages: a JSON header frame, then a raw payload frame.
"""
from __future__ import annotations

from lab_utils.launcher.relay.api import (BACKEND, MAX_BUFFERED, MAX_CONNECTIONS_PER_RANK, MAX_HEADER, MAX_PAYLOAD,
                                          OPS, Call, Endpoint, RelayError)
from lab_utils.launcher.relay.group import join
from lab_utils.launcher.relay.server import Relay
from lab_utils.launcher.relay.traffic import Traffic

__all__ = ["BACKEND", "MAX_BUFFERED", "MAX_CONNECTIONS_PER_RANK", "MAX_HEADER", "MAX_PAYLOAD", "OPS", "Call",
           "Endpoint", "Relay", "RelayError", "Traffic", "join"]
