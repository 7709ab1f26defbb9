"""The relay's arithmetic, as pure functions on headers and bytes: a frame checked into a ``Call``, and every member's
reply to one collective computed from what each member sent. No sockets, no threads, no state: the server calls
these, and tests call them on bytes."""
from __future__ import annotations

import itertools

from lab_utils.launcher.relay.api import OPS, Call, RelayError

REDUCE_OPS = ("SUM", "AVG", "PRODUCT", "MIN", "MAX")


def dtypes() -> dict:
    """The dtypes the relay carries, by the name a header gives them (``"float32"``)."""
    import torch

    return {str(d).removeprefix("torch."): d for d in (
        torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64, torch.complex128,
        torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)}


def tensor(payload: bytes, dtype: str, shape):
    """The tensor of ``dtype`` and ``shape`` whose raw bytes ``payload`` holds (a copy), or a ``RelayError``."""
    import torch

    dt = dtypes().get(dtype)
    if dt is None:
        raise RelayError(f"the relay does not carry tensors of dtype {dtype}")
    n = 1
    for s in shape:
        n *= int(s)
    if len(payload) != n * dt.itemsize:
        raise RelayError(f"{len(payload)} bytes do not hold a {dtype} tensor of shape {tuple(shape)}")
    t = torch.frombuffer(bytearray(payload), dtype=dt) if payload else torch.empty(0, dtype=dt)
    return t.reshape(tuple(int(s) for s in shape))


def tensor_bytes(t) -> bytes:
    """A tensor's raw bytes (from host memory, contiguous): what crosses the relay's sockets."""
    import torch

    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    return t.view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def describe(rank: int, h: dict, payload: bytes, keep_data: bool = False) -> Call:
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
    keep = keep_data and op != "recv"
    return Call(rank, op, group, peer, nbytes, str(h.get("dtype", "")), shape, tag, payload if keep else b"")


def reduce(stack, how: str):
    """``stack`` (one row per rank) reduced along its first dimension as ``ReduceOp`` ``how`` does."""
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


def combine(group: tuple, ins: dict) -> dict:
    """Every member's reply to one collective, computed from what each member sent.

    ``group``: the members' global ranks, in group order; ``ins``: {global rank: (header, payload)} for every member.
    Returns {global rank: reply bytes}, or raises a ``RelayError`` that names what the members disagree on.
    """
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
        return [tensor(ins[g][1], ins[g][0]["dtype"], ins[g][0]["shape"]) for g in group]

    def same_shapes(what):
        if len(set(shapes.values())) != 1:
            said = ", ".join(f"rank {r}: {d} {s}" for r, (d, s) in sorted(shapes.items()))
            raise RelayError(f"{what} needs the same tensor on every rank (call {seq} on group {group}): {said}")

    def reduced():
        return reduce(torch.stack(tensors()), h0.get("reduce", "SUM"))

    if op == "barrier":
        return {r: b"" for r in ins}
    if op in ("allreduce", "reduce"):
        same_shapes(op)
        out = tensor_bytes(reduced().to(tensors()[0].dtype))
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
        chunks = reduced().reshape(len(group), -1)
        return {r: tensor_bytes(chunks[pos[r]]) for r in ins}
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
