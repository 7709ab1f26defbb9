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
"""
from __future__ import annotations

import functools
import itertools
import json
import os
import socket
import struct
import tempfile
import threading
from dataclasses import dataclass, field

from lab_utils.launcher import wire

BACKEND = "dtrelay"
_HEAD = struct.Struct("!II")  # header length, payload length
MAX_HEADER = 64 << 10
MAX_PAYLOAD = 256 << 20  # one message
MAX_BUFFERED = 512 << 20  # everything the relay holds at once (undelivered sends, unfinished collectives)
MAX_CONNECTIONS_PER_RANK = 2
OPS = ("send", "recv", "allreduce", "broadcast", "allgather", "reduce_scatter", "alltoall", "barrier", "reduce",
       "gather", "scatter")


class RelayError(RuntimeError):
    """A call the relay cannot serve: mismatched collectives, a wrong size, a frame over its limit."""


@dataclass(frozen=True)
class Call:
    """One call a rank made on the relay's process group, as the relay saw it."""

    rank: int  # the caller's global rank
    op: str  # one of OPS
    group: tuple  # global ranks of the group the call was made on
    peer: int | None  # global rank sent to / received from (send, recv); the root of broadcast/reduce/gather/scatter
    nbytes: int  # bytes the caller handed over (send, collectives) or received (recv)
    dtype: str
    shape: tuple
    tag: int = 0
    data: bytes = field(default=b"", repr=False, compare=False)  # what the caller handed over (a send's message, a
    # collective's input), when ``Traffic(keep_data=True)``


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
        return _tensor(call.data, call.dtype, call.shape)

    def start(self, world_size: int, directory: str | None = None) -> Relay:
        """A relay for one launch of ``world_size`` ranks, listening in ``directory`` (a private temp folder by
        default; under grading, a folder the sandboxed ranks see at the same path)."""
        return Relay(self, world_size, directory)


# ------------------------------------------------------------------------------------------------ framing
def _send(sock, header: dict, payload: bytes = b"") -> None:
    h = json.dumps(header).encode()
    sock.sendall(_HEAD.pack(len(h), len(payload)) + h + payload)


def _recv_exact(sock, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _recv(sock, max_payload: int = MAX_PAYLOAD):
    """(header, payload), or (None, None) at end of stream; lengths are checked before anything is read."""
    pre = _recv_exact(sock, _HEAD.size)
    if pre is None:
        return None, None
    hlen, plen = _HEAD.unpack(pre)
    if hlen > MAX_HEADER or plen > max_payload:
        # the declared lengths are the sender's to choose: only the limit is said
        raise RelayError(f"a frame over the relay's limit ({MAX_HEADER} + {max_payload} bytes), refused unread")
    head = _recv_exact(sock, hlen)
    payload = _recv_exact(sock, plen) if plen else b""
    if head is None or payload is None:
        return None, None
    header = json.loads(head)
    if not isinstance(header, dict):
        raise RelayError("a relay header must be a JSON object")
    return header, payload


def _dtypes():
    import torch

    return {str(d).removeprefix("torch."): d for d in (
        torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64, torch.complex128,
        torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)}


def _tensor(payload: bytes, dtype: str, shape):
    import torch

    dt = _dtypes().get(dtype)
    if dt is None:
        raise RelayError(f"the relay does not carry tensors of dtype {dtype}")
    t = torch.frombuffer(bytearray(payload), dtype=dt) if payload else torch.empty(0, dtype=dt)
    n = 1
    for s in shape:
        n *= int(s)
    if t.numel() != n:
        raise RelayError(f"{len(payload)} bytes do not hold a {dtype} tensor of shape {tuple(shape)}")
    return t.reshape(tuple(int(s) for s in shape))


def _bytes(t) -> bytes:
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    return t.view(-1).view(__import__("torch").uint8).numpy().tobytes() if t.numel() else b""


# ------------------------------------------------------------------------------------------------ the relay
class Relay:
    """The relay thread for one launch: accepts the ranks' connections, moves bytes, records calls."""

    BACKEND = BACKEND

    def __init__(self, traffic: Traffic, world_size: int, directory: str | None = None):
        self.traffic, self.world_size = traffic, world_size
        self._tmp = None if directory else tempfile.mkdtemp(prefix="dtlabs-relay-")
        folder = directory or self._tmp
        self.address = os.path.join(folder, f".dtlabs-relay-{os.getpid()}-{id(self):x}.sock")
        self._cond = threading.Condition()
        self._pending: dict = {}  # (group, seq) -> {"in": {rank: (header, payload)}, "out": ..., "done": set()}
        self._mail: dict = {}  # (src, dst, tag, group) -> [payload]: sent, not yet received
        self._waiting: dict = {}  # (src, dst, tag, group) -> [slot]: recvs posted, not yet matched
        self._joined: set = set()  # ranks that said hello
        self._buffered = 0
        self._conns: list[socket.socket] = []
        self._stopped = False
        self._srv = wire.listen_unix(self.address)
        threading.Thread(target=self._accept, name="dtlabs-relay", daemon=True).start()

    def stop(self) -> None:
        self._stopped = True
        with self._cond:
            self._cond.notify_all()
        wire.close_unix(self.address, self._srv, *self._conns)
        if self._tmp:
            os.rmdir(self._tmp)

    def _accept(self) -> None:
        while not self._stopped:
            try:
                conn, _ = self._srv.accept()
            except OSError:
                return
            if len(self._conns) >= MAX_CONNECTIONS_PER_RANK * self.world_size:
                conn.close()
                continue
            self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), name="dtlabs-relay-conn", daemon=True).start()

    def _serve(self, conn) -> None:
        """One rank's connection. Frames are read, described and recorded here, in the order the rank sent them;
        sends are posted to the mailbox and recvs queued here too, so that messages between two ranks never overtake
        each other (two ``isend`` calls to one peer arrive in their order, whatever the threads that answer them do)."""
        lock = threading.Lock()
        rank = None
        try:
            while not self._stopped:
                header, payload = _recv(conn)
                if header is None:
                    return
                if rank is None:
                    rank = header.get("rank")
                    if header.get("op") != "hello" or not isinstance(rank, int) or not 0 <= rank < self.world_size:
                        return
                    with self._cond:
                        if rank in self._joined:  # one connection per rank: no call is made in another rank's name
                            return
                        self._joined.add(rank)
                    continue
                try:
                    call = self._describe(rank, header, payload)
                    self.traffic.record(call)
                    if call.op == "send":
                        self._post(call, payload)
                        self._reply(conn, lock, header)
                        continue
                    slot = self._queue_recv(call) if call.op == "recv" else None
                except RelayError as exc:
                    self._reply(conn, lock, header, error=str(exc))
                    continue
                threading.Thread(target=self._call, args=(conn, lock, call, header, payload, slot), daemon=True).start()
        except (OSError, RelayError, ValueError):
            return
        finally:
            conn.close()

    def _reply(self, conn, lock, header, payload=b"", error=None) -> None:
        try:
            with lock:
                _send(conn, {"id": header.get("id"), "error": error}, payload)
        except OSError:
            pass

    def _call(self, conn, lock, call, header, payload, slot) -> None:
        try:
            out = self._wait_recv(call, slot) if call.op == "recv" else self._serve_collective(call, header, payload)
            self._reply(conn, lock, header, out)
        except RelayError as exc:
            self._reply(conn, lock, header, error=str(exc))
        except Exception as exc:  # noqa: BLE001 - a bad frame is the rank's error, never the relay's crash
            self._reply(conn, lock, header, error=f"{type(exc).__name__}: {exc}")

    def _hold(self, n: int) -> None:
        if self._buffered + n > MAX_BUFFERED:
            raise RelayError(f"the relay holds more than {MAX_BUFFERED >> 20} MB of undelivered messages")
        self._buffered += n

    def _describe(self, rank, h, payload) -> Call:
        """The ``Call`` a frame makes, checked: a known op, on a group the caller is in, to a peer in that group."""
        op = h.get("op")
        if op not in OPS:
            raise RelayError(f"unknown relay call {op!r}")
        try:
            group = tuple(int(r) for r in h.get("group", ()))
            peer = h.get("peer")
            if "root" in h:  # rooted collectives: the root's global rank
                root = int(h["root"])
                peer = group[root] if 0 <= root < len(group) else None
            elif peer is not None:
                peer = int(peer)
            shape = tuple(int(s) for s in h.get("shape", ()))
            nbytes = len(payload) if op != "recv" else int(h.get("nbytes", 0))
            tag = int(h.get("tag", 0))
        except (TypeError, ValueError) as exc:
            raise RelayError(f"a malformed {op} call from rank {rank}: {exc}") from None
        if rank not in group:
            raise RelayError(f"rank {rank} called {op} on a group it is not in: {group}")
        if op in ("send", "recv") and peer not in group:
            raise RelayError(f"rank {rank} called {op} with peer {peer}, which is not in its group {group}")
        if op in ("send", "recv") and peer == rank:
            raise RelayError(f"rank {rank} called {op} with itself as the peer")
        keep = self.traffic.keep_data and op != "recv"
        return Call(rank, op, group, peer, nbytes, str(h.get("dtype", "")), shape, tag, payload if keep else b"")

    def _post(self, call, payload) -> None:
        """A send: into the mailbox of (sender, receiver, tag, group), or straight to the oldest recv waiting for it."""
        with self._cond:
            self._hold(len(payload))
            key = (call.rank, call.peer, call.tag, call.group)
            self._mail.setdefault(key, []).append(payload)
            self._match(key)
            self._cond.notify_all()

    def _queue_recv(self, call) -> dict:
        """A recv, queued behind the earlier recvs of the same (sender, receiver, tag, group) in the order they came."""
        slot = {"data": None}
        with self._cond:
            key = (call.peer, call.rank, call.tag, call.group)
            self._waiting.setdefault(key, []).append(slot)
            self._match(key)
        return slot

    def _match(self, key) -> None:  # under self._cond: oldest message to oldest recv
        mail, waiting = self._mail.get(key), self._waiting.get(key)
        while mail and waiting:
            slot = waiting.pop(0)
            slot["data"] = mail.pop(0)
            self._buffered -= len(slot["data"])

    def _wait_recv(self, call, slot) -> bytes:
        with self._cond:
            while slot["data"] is None:
                if self._stopped:
                    raise RelayError("the launch ended")
                self._cond.wait(0.5)
        data = slot["data"]
        if len(data) != call.nbytes:
            raise RelayError(f"rank {call.rank} called recv for {call.nbytes} bytes from rank {call.peer}, which sent "
                             f"{len(data)} bytes: the tensors on the two sides differ in size or dtype")
        return data

    def _serve_collective(self, call, h, payload) -> bytes:
        group, rank = call.group, call.rank
        key = (group, int(h.get("seq", 0)))
        with self._cond:
            self._hold(len(payload))
            slot = self._pending.setdefault(key, {"in": {}, "out": None, "done": set()})
            if rank in slot["in"]:
                self._buffered -= len(payload)
                raise RelayError(f"rank {rank} made collective call {key[1]} on group {group} twice")
            slot["in"][rank] = (h, payload)
            if len(slot["in"]) == len(group):
                try:
                    slot["out"] = self._collective(group, slot["in"])
                except RelayError as exc:
                    slot["out"] = exc
                self._buffered -= sum(len(p) for _, p in slot["in"].values())
                self._cond.notify_all()
            while slot["out"] is None:
                if self._stopped:
                    raise RelayError("the launch ended")
                self._cond.wait(0.5)
            slot["done"].add(rank)
            if len(slot["done"]) == len(group):
                self._pending.pop(key, None)
            if isinstance(slot["out"], RelayError):
                raise slot["out"]
            return slot["out"][rank]

    def _collective(self, group, ins) -> dict:
        """Every member's reply to one collective, computed here from what each member sent."""
        import torch

        ops = {r: h["op"] for r, (h, _) in ins.items()}
        seq = next(iter(ins.values()))[0].get("seq")
        if len(set(ops.values())) != 1:
            said = ", ".join(f"rank {r} in {o}" for r, o in sorted(ops.items()))
            raise RelayError(f"mismatched collectives (call {seq} on group {group}): {said}")
        op = next(iter(ops.values()))
        h0 = ins[group[0]][0]
        shapes = {r: (h.get("dtype"), tuple(h.get("shape", ()))) for r, (h, _) in ins.items()}
        pos = {g: i for i, g in enumerate(group)}

        def tensors():
            return [_tensor(ins[g][1], ins[g][0]["dtype"], ins[g][0]["shape"]) for g in group]

        def same_shapes(what):
            if len(set(shapes.values())) != 1:
                said = ", ".join(f"rank {r}: {d} {s}" for r, (d, s) in sorted(shapes.items()))
                raise RelayError(f"{what} needs the same tensor on every rank (call {seq} on group {group}): {said}")

        def reduce(stack, how):
            how = h0.get("reduce", "SUM")
            if how == "SUM":
                return stack.sum(0)
            if how == "AVG":
                return stack.mean(0) if stack.is_floating_point() else stack.sum(0) // stack.shape[0]
            if how == "PRODUCT":
                return stack.prod(0)
            if how == "MAX":
                return stack.max(0).values
            if how == "MIN":
                return stack.min(0).values
            raise RelayError(f"reduce op {how} is not supported by the relay")

        if op == "barrier":
            return {r: b"" for r in ins}
        if op in ("allreduce", "reduce"):
            same_shapes(op)
            out = _bytes(reduce(torch.stack(tensors()), h0.get("reduce")).to(tensors()[0].dtype))
            if op == "reduce":
                root = group[int(h0.get("root", 0))]
                return {r: (out if r == root else b"") for r in ins}
            return {r: out for r in ins}
        if op == "broadcast":
            same_shapes("broadcast")
            return {r: ins[group[int(h0.get("root", 0))]][1] for r in ins}
        if op in ("allgather", "gather"):
            same_shapes(op)
            out = b"".join(ins[g][1] for g in group)
            if op == "gather":
                root = group[int(h0.get("root", 0))]
                return {r: (out if r == root else b"") for r in ins}
            return {r: out for r in ins}
        if op == "reduce_scatter":  # every rank sends its whole input: world chunks, rank i gets the reduced chunk i
            same_shapes(op)
            full = reduce(torch.stack(tensors()), h0.get("reduce"))
            chunks = full.reshape(len(group), -1)
            return {r: _bytes(chunks[pos[r]]) for r in ins}
        if op == "scatter":
            root = group[int(h0.get("root", 0))]
            data = ins[root][1]
            n = len(data) // len(group)
            return {r: data[pos[r] * n:(pos[r] + 1) * n] for r in ins}
        if op == "alltoall":  # each rank's input split in len(group) chunks (sizes in "splits", bytes)
            out = {}
            for r in ins:
                parts = []
                for g in group:
                    splits = ins[g][0].get("splits")
                    offs = [0, *itertools.accumulate(splits)]
                    parts.append(ins[g][1][offs[pos[r]]:offs[pos[r] + 1]])
                out[r] = b"".join(parts)
            return out
        raise RelayError(f"the relay does not implement {op}")


# ------------------------------------------------------------------------------------------------ rank side
class _Connection:
    """A rank's one connection to the relay; calls are answered in any order, matched by id."""

    def __init__(self, address: str, rank: int):
        self.sock = wire.connect_unix(address)
        self.lock = threading.Lock()
        self.pending: dict = {}
        self.ids = itertools.count()
        _send(self.sock, {"op": "hello", "rank": rank})
        threading.Thread(target=self._read, name="dtlabs-relay-reader", daemon=True).start()

    def _read(self) -> None:
        error = "the relay closed the connection (the launch ended)"
        try:
            while True:
                header, payload = _recv(self.sock, max_payload=MAX_PAYLOAD * 64)
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
        except (OSError, RelayError) as exc:
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
            _send(self.sock, {"id": i, **header}, payload)
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
                    t.copy_(_tensor(payload[offset:offset + n], dtype_name(t), list(t.shape)))
                    offset += n
            return tensors
        return done

    def reduce_name(opts):
        op = getattr(opts, "reduceOp", dist.ReduceOp.SUM)
        for name in ("SUM", "AVG", "PRODUCT", "MIN", "MAX"):
            if op == getattr(dist.ReduceOp, name):
                return name
        raise RelayError(f"reduce op {op} is not supported by the relay")

    class RelayGroup(dist.ProcessGroup):
        """A process group whose calls are served by the launcher's relay (see the module docstring)."""

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
            payload = b"".join(_bytes(t) for t in payload_tensors) if op != "recv" else b""
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


class Endpoint:
    """A relay that runs in another process (the grader's), named by its socket's path; ``launch`` accepts it
    where it accepts a ``Traffic``."""

    BACKEND = BACKEND

    def __init__(self, address: str):
        self.address = address

    def start(self, world_size: int) -> Endpoint:
        return self

    def stop(self) -> None:
        pass
