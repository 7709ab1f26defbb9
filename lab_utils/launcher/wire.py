"""Length-prefixed messages over pipes and sockets, shared by the launcher and its workers.

Kept tiny and stdlib-only so the zygote can import it before torch.
"""
from __future__ import annotations

import json
import os
import struct

_HEADER = struct.Struct("!Q")


def write_frame(fd: int, payload: bytes) -> None:
    """Write one frame (8-byte big-endian length, then the bytes) to a raw fd."""
    data = _HEADER.pack(len(payload)) + payload
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def read_exact(fd: int, n: int) -> bytes | None:
    """Read exactly n bytes, or None on EOF before the first byte (EOF mid-frame also gives None)."""
    chunks = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_frame(fd: int) -> bytes | None:
    header = read_exact(fd, _HEADER.size)
    if header is None:
        return None
    (size,) = _HEADER.unpack(header)
    return read_exact(fd, size) if size else b""


def send_json(sock, obj, fds=()) -> None:
    """Send a JSON message on a Unix socket, optionally with file descriptors (SCM_RIGHTS)."""
    payload = json.dumps(obj).encode()
    data = _HEADER.pack(len(payload)) + payload
    if fds:
        import socket

        socket.send_fds(sock, [data], list(fds))
    else:
        sock.sendall(data)


def recv_json(sock, maxfds=0):
    """Receive one JSON message (and the fds sent with it). Returns (None, []) on EOF."""
    import socket

    fds: list[int] = []
    if maxfds:
        data, fds, _flags, _addr = socket.recv_fds(sock, _HEADER.size, maxfds)
    else:
        data = sock.recv(_HEADER.size)
    if not data:
        return None, fds
    while len(data) < _HEADER.size:
        more = sock.recv(_HEADER.size - len(data))
        if not more:
            return None, fds
        data += more
    (size,) = _HEADER.unpack(data)
    body = b""
    while len(body) < size:
        more = sock.recv(size - len(body))
        if not more:
            return None, fds
        body += more
    return json.loads(body), fds
