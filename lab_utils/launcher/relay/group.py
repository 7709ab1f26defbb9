"""The rank's side of the relay: ``RelayGroup``, a ``torch.distributed`` backend whose every call goes over the rank's
one connection to the relay, and ``join``, which registers it. Replies are matched to calls by id, so calls in
flight (``isend``, async collectives) complete in any order."""
from __future__ import annotations

import functools
import itertools
import os
import threading

from lab_utils import sockets
from lab_utils.launcher import wire
from lab_utils.launcher.relay import collectives
from lab_utils.launcher.relay.api import BACKEND, MAX_HEADER, MAX_PAYLOAD, RelayError


class _Connection:
    """A rank's one connection to the relay; calls are answered in any order, matched by id."""

    def __init__(self, address: str, rank: int):
        self.sock = sockets.connect_unix(address)
        self.lock = threading.Lock()
        self.pending: dict = {}
        self.ids = itertools.count()
        wire.send_message(self.sock, {"op": "hello", "rank": rank})
        threading.Thread(target=self._read, name="dtlabs-relay-reader", daemon=True).start()

    def _read(self) -> None:
        error = "the relay closed the connection (the launch ended)"
        try:
            while True:
                header, payload = wire.recv_message(self.sock, MAX_HEADER, MAX_PAYLOAD * 64)
                if header is None:
                    break
                fut, done = self.pending.pop(header.get("id"), (None, None))
                if fut is None:
                    continue
                value, failure = None, None
                if header.get("error"):
                    failure = RelayError(header["error"])
                else:
                    try:
                        value = done(payload)
                    except Exception as exc:  # noqa: BLE001 - the rank's call raises it
                        failure = exc
                # Completed on a thread of its own: a future's callbacks run where it completes, and a callback may
                # wait for another call of ours (PowerSGD's hook does), whose reply only this thread can read.
                threading.Thread(target=_complete, args=(fut, value, failure), name="dtlabs-relay-done",
                                 daemon=True).start()
        except (OSError, ValueError) as exc:  # a frame over the limit, a header that is not JSON
            error = f"lost the relay: {exc}"
        for fut, _ in list(self.pending.values()):
            fut.set_exception(RelayError(error))

    def call(self, header: dict, payload: bytes, done):
        """Send one call; returns a ``Work`` whose future holds ``done(reply_payload)`` (or the relay's error, which
        ``wait`` raises: a synchronous collective that failed must fail in the student's code, not return)."""
        from torch.futures import Future

        fut = Future()
        with self.lock:
            i = next(self.ids)
            self.pending[i] = (fut, done)
            wire.send_message(self.sock, {"id": i, **header}, payload)
        return _work_class()(fut)


def _complete(fut, value, failure) -> None:
    if failure is not None:
        fut.set_exception(failure)
    else:
        fut.set_result(value)


_connection: _Connection | None = None


@functools.cache
def _work_class():
    import torch.distributed as dist

    class RelayWork(dist.Work):
        """One call in flight on the relay. (``_create_work_from_future`` would do, but its ``wait`` returns True
        even when the future failed.)"""

        def __init__(self, fut):
            super().__init__()
            self.fut = fut

        def wait(self, timeout=None):
            self.fut.wait()  # raises the relay's error
            return True

        def is_completed(self):
            return self.fut.done()

        def get_future(self):
            return self.fut

    return RelayWork


def _group_class():
    import torch
    import torch.distributed as dist

    def dtype_name(t):
        return str(t.dtype).removeprefix("torch.")

    def fill(tensors):  # copy a reply into the caller's tensor(s); the future's value is the tensor list
        def done(payload):
            offset = 0
            with torch.no_grad():  # as a backend writes: a parameter (a leaf that requires grad) can be received into
                for t in tensors:
                    n = t.numel() * t.element_size()
                    t.copy_(collectives.tensor(payload[offset:offset + n], dtype_name(t), list(t.shape)))
                    offset += n
            return tensors
        return done

    def reduce_name(opts):
        op = getattr(opts, "reduceOp", dist.ReduceOp.SUM)
        for name in collectives.REDUCE_OPS:
            if op == getattr(dist.ReduceOp, name):
                return name
        raise RelayError(f"reduce op {op} is not supported by the relay")

    class RelayGroup(dist.ProcessGroup):
        """A process group whose calls are served by the launcher's relay (see ``lab_utils.launcher.relay``)."""

        def __init__(self, rank, size):
            super().__init__(rank, size)
            self._seq = 0
            self._ranks = None
            self._name = None

        # c10d stores the group's name on its backends; this group has none, so it keeps it itself
        def _set_group_name(self, name):
            self._name = name

        @property
        def group_name(self):
            return self._name

        def getBackendName(self):
            return BACKEND

        def _global(self):
            if self._ranks is None:
                self._ranks = tuple(dist.get_process_group_ranks(self))
            return self._ranks

        def _call(self, op, payload_tensors, done, **fields):
            header = {"op": op, "group": self._global(), **fields}
            if op not in ("send", "recv"):
                self._seq += 1
                header["seq"] = self._seq
            if payload_tensors:
                t = payload_tensors[0]
                header.update(dtype=dtype_name(t), shape=list(t.shape))
            payload = b"".join(collectives.tensor_bytes(t) for t in payload_tensors) if op != "recv" else b""
            return _connection.call(header, payload, done)

        # ---------------------------------------------------------------------------- point to point
        def send(self, tensors, dst, tag=0):
            return self._call("send", tensors, lambda p: tensors, peer=self._global()[dst], tag=tag)

        def recv(self, tensors, src, tag=0):
            t = tensors[0]
            return self._call("recv", [], fill(tensors), peer=self._global()[src], tag=tag,
                              nbytes=t.numel() * t.element_size(), dtype=dtype_name(t), shape=list(t.shape))

        # ---------------------------------------------------------------------------- collectives
        def allreduce(self, tensors, opts=None):
            return self._call("allreduce", tensors[:1], fill(tensors[:1]), reduce=reduce_name(opts))

        def allreduce_coalesced(self, tensors, opts=None):
            flat = torch.cat([t.reshape(-1) for t in tensors])
            def done(p):
                fill([flat])(p)
                off = 0
                with torch.no_grad():
                    for t in tensors:
                        t.copy_(flat[off:off + t.numel()].view_as(t))
                        off += t.numel()
                return tensors
            return self._call("allreduce", [flat], done, reduce=reduce_name(opts))

        def reduce(self, tensors, opts=None):
            root = opts.rootRank
            me = self._global().index(dist.get_rank())
            done = fill(tensors[:1]) if me == root else (lambda p: tensors)
            return self._call("reduce", tensors[:1], done, reduce=reduce_name(opts), root=root)

        def broadcast(self, tensors, opts=None):
            return self._call("broadcast", tensors[:1], fill(tensors[:1]), root=opts.rootRank)

        def allgather(self, output_tensors, input_tensors, opts=None):
            return self._call("allgather", input_tensors[:1], fill(output_tensors[0]))

        def _allgather_base(self, output, input, opts=None):
            return self._call("allgather", [input], fill([output]))

        def all_gather_single(self, output, input, opts=None):  # torch >= 2.13: all_gather_into_tensor calls this
            return self._allgather_base(output, input, opts)

        def all_gather_single_coalesced(self, outputs, inputs, opts=None):
            return self.allgather_into_tensor_coalesced(outputs, inputs, opts)

        def allgather_coalesced(self, output_lists, inputs, opts=None):
            work = None
            for outs, i in zip(output_lists, inputs):
                work = self.allgather([outs], [i], opts)
                work.wait()
            return work

        def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
            work = None
            for o, i in zip(outputs, inputs):
                work = self._allgather_base(o, i)
                work.wait()
            return work

        def gather(self, output_tensors, input_tensors, opts=None):
            root = opts.rootRank
            me = self._global().index(dist.get_rank())
            done = fill(output_tensors[0]) if me == root else (lambda p: input_tensors)
            return self._call("gather", input_tensors[:1], done, root=root)

        def scatter(self, output_tensors, input_tensors, opts=None):
            root = opts.rootRank
            me = self._global().index(dist.get_rank())
            sent = [torch.cat([t.reshape(-1) for t in input_tensors[0]])] if me == root else []
            header = {}
            if not sent:  # non-root ranks send nothing but must name the tensor they expect
                header = {"dtype": dtype_name(output_tensors[0]), "shape": list(output_tensors[0].shape)}
            return self._call("scatter", sent, fill(output_tensors[:1]), root=root, **header)

        def reduce_scatter(self, output_tensors, input_tensors, opts=None):
            flat = torch.cat([t.reshape(-1) for t in input_tensors[0]])
            return self._call("reduce_scatter", [flat], fill(output_tensors[:1]), reduce=reduce_name(opts))

        def _reduce_scatter_base(self, output, input, opts=None):
            return self._call("reduce_scatter", [input.reshape(-1)], fill([output]), reduce=reduce_name(opts))

        def reduce_scatter_single(self, output, input, opts=None):  # torch >= 2.13: reduce_scatter_tensor calls this
            return self._reduce_scatter_base(output, input, opts)

        def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
            return self.reduce_scatter_tensor_coalesced(outputs, inputs, opts)

        def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
            work = None
            for o, i in zip(outputs, inputs):
                work = self._reduce_scatter_base(o, i, opts)
                work.wait()
            return work

        def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
            n = len(self._global())
            rows = input.shape[0] if input.dim() else input.numel()
            splits = list(input_split_sizes) or [rows // n] * n
            per_row = input[0].numel() * input.element_size() if input.dim() > 1 else input.element_size()
            return self._call("alltoall", [input.contiguous()], fill([output]), splits=[s * per_row for s in splits])

        def alltoall(self, output_tensors, input_tensors, opts=None):
            flat = torch.cat([t.reshape(-1) for t in input_tensors])
            splits = [t.numel() * t.element_size() for t in input_tensors]
            return self._call("alltoall", [flat], fill(output_tensors), splits=splits)

        def barrier(self, opts=None):
            return self._call("barrier", [], lambda p: [])

    return RelayGroup


def join(address: str) -> None:
    """In a rank, before ``init_process_group(backend=BACKEND)``: register the relay's process group and connect."""
    global _connection
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    _connection = _Connection(address, rank)
    group_class = _group_class()
    if BACKEND not in dist.Backend.backend_list:
        dist.Backend.register_backend(BACKEND, lambda store, r, size, timeout: group_class(r, size),
                                      devices=["cpu", "cuda"])
