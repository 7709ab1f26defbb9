"""Length-prefixed messages over pipes and sockets, shared by the launcher and its workers.

Kept tiny and stdlib-only so the zygote can import it before torch.
"""
from __future__ import annotations

import json
import os
import struct

_HEADER = struct.Struct("!Q")
MAX_JSON = 1 << 20  # control messages are a few hundred bytes


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


class FrameTooLarge(ValueError):
    """A frame's header declares more bytes than the reader accepts: refused before a byte of it is read."""

    def __init__(self, size: int, limit: int):
        # the declared size is the sender's to choose (a grade's output may reach a student): only the limit is said
        super().__init__(f"a frame over the {limit}-byte limit, refused unread")
        self.size, self.limit = size, limit


def read_frame(fd: int, max_bytes: int | None = None) -> bytes | None:
    """One frame's payload, or None at end of stream. ``max_bytes``: refuse (``FrameTooLarge``) a frame declared
    larger, before reading it: what a header declares is the sender's to choose."""
    return _frame(lambda n: read_exact(fd, n), max_bytes)


def _frame(read, max_bytes: int | None) -> bytes | None:
    """One frame through ``read(n)`` (n bytes, or None at end of stream), its declared size checked first."""
    header = read(_HEADER.size)
    if header is None:
        return None
    (size,) = _HEADER.unpack(header)
    if max_bytes is not None and size > max_bytes:
        raise FrameTooLarge(size, max_bytes)
    return read(size) if size else b""


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
    if len(data) < _HEADER.size:
        more = recv_exact(sock, _HEADER.size - len(data))
        if more is None:
            return None, fds
        data += more
    (size,) = _HEADER.unpack(data)
    if size > MAX_JSON:
        raise FrameTooLarge(size, MAX_JSON)
    body = recv_exact(sock, size) if size else b""
    if body is None:
        return None, fds
    return json.loads(body), fds


def recv_exact(sock, n: int) -> bytes | None:
    """``read_exact`` on a socket object (one with a timeout too), or None on EOF."""
    buf = bytearray(n)
    view = memoryview(buf)
    while view:
        got = sock.recv_into(view, min(len(view), 1 << 20))
        if not got:
            return None
        view = view[got:]
    return bytes(buf)


def recv_frame(sock, max_bytes: int | None = None) -> bytes | None:
    """``read_frame`` on a socket object: one frame's payload, or None at end of stream."""
    return _frame(lambda n: recv_exact(sock, n), max_bytes)


def send_message(sock, header: dict, payload: bytes = b"") -> None:
    """A JSON header and raw bytes (a tensor's) as two frames, sent at once: the bytes never go through JSON."""
    h = json.dumps(header).encode()
    sock.sendall(b"".join((_HEADER.pack(len(h)), h, _HEADER.pack(len(payload)), payload)))


def recv_message(sock, max_header: int = MAX_JSON, max_payload: int | None = None):
    """(header, payload) as ``send_message`` sent them, or (None, None) at end of stream. Each frame's declared
    length is checked against its limit before the frame is read (``FrameTooLarge``)."""
    head = recv_frame(sock, max_header)
    if head is None:
        return None, None
    payload = recv_frame(sock, max_payload)
    if payload is None:
        return None, None
    header = json.loads(head)
    if not isinstance(header, dict):
        raise ValueError("a message header must be a JSON object")
    return header, payload
