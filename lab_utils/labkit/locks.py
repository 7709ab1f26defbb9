"""A lock whose every acquisition is counted by the process that made it: ``CountedLock`` (Lab 09's Hogwild! test).

Why it exists: a test must know whether a student's workers took a lock, and how often, and a counter kept inside
the workers (a wrapper around ``acquire``, a shared integer) runs in the student's processes, where it can be
forged. ``CountedLock`` is served by a thread of the process that creates it (in a test cell: the grader's kernel
under grading, which runs no student code) over a Unix socket; the workers get a ``LockClient`` that only names the
socket. Every ``acquire`` is a request the server grants, so the server's record of grants (with the peer's pid,
read from the socket by the kernel: ``SO_PEERCRED``) is what really happened through *this* lock. A worker that uses
another lock is simply not counted, as with ``Traffic``: tests ask for what the right algorithm must do through it.

The socket lives in ``directory`` (default: ``sockets.socket_folder()``, which under grading is the folder the grader
made for the subject's sockets: the subject reaches it at the same path and cannot write it). A client connects lazily, once per process, so a client
inherited through ``fork`` or sent by pickle works in every worker. A connection that closes while it holds the
lock releases it (a worker that died does not block the others).

``grant_delay`` makes every request wait that long before it may be granted, so that every worker is waiting for the
lock at once and the grants interleave the workers. A worker that reads the shared weights *before* it asks for the
lock then reads weights that another worker's granted update is about to change: its update is lost, and the final
weights part from a replay of the updates in grant order (``grants``), which a worker that reads under the lock
matches exactly (Lab 09's test of the locked baseline).
"""
from __future__ import annotations

import os
import socket
import struct
import threading
import time
import uuid

from lab_utils import sockets

__all__ = ["CountedLock", "LockClient"]

MAX_CONNECTIONS = 256
_ACQUIRE, _RELEASE, _GRANTED, _RELEASED = b"A", b"R", b"G", b"K"


class CountedLock:
    """The server side: a mutual-exclusion lock whose grants are recorded here. Use ``client()`` in workers.

    ``grants``: one ``(pid, acquired_s, released_s)`` per acquisition, in grant order (seconds since the lock was
    made; ``released_s`` is None while held); ``acquisitions`` and ``pids`` summarise them. ``grant_delay``: seconds
    each request waits before it may be granted (module docstring)."""

    def __init__(self, directory: str | None = None, grant_delay: float = 0.0):
        if not 0 <= grant_delay <= 1:
            raise ValueError(f"grant_delay is in seconds, between 0 and 1, got {grant_delay!r}")
        self.grant_delay = grant_delay
        folder = directory or sockets.socket_folder()
        self.address = os.path.join(folder, f".dtlabs-lock-{uuid.uuid4().hex[:10]}.sock")
        self.grants: list = []
        self._mutex = threading.Lock()  # the lock itself
        self._record = threading.Lock()  # guards ``grants``
        self._t0 = time.monotonic()
        self._conns: list = []
        self._closed = False
        self._srv = sockets.listen_unix(self.address, MAX_CONNECTIONS, mode=sockets.socket_mode(folder))
        threading.Thread(target=self._accept, name="dtlabs-counted-lock", daemon=True).start()

    def client(self) -> LockClient:
        return LockClient(self.address)

    @property
    def acquisitions(self) -> int:
        with self._record:
            return len(self.grants)

    @property
    def pids(self) -> list:
        """The distinct processes that took the lock, in order of their first acquisition."""
        with self._record:
            return list(dict.fromkeys(g[0] for g in self.grants))

    def close(self) -> None:
        self._closed = True
        sockets.close_unix(self.address, self._srv, *self._conns)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._srv.accept()
            except OSError:
                return
            if len(self._conns) >= MAX_CONNECTIONS:
                conn.close()
                continue
            self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn) -> None:
        try:
            pid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
        except OSError:
            pid = -1
        held = None  # index in ``grants`` of this connection's current hold
        try:
            while not self._closed:
                cmd = conn.recv(1)
                if cmd == _ACQUIRE and held is None:
                    if self.grant_delay:
                        time.sleep(self.grant_delay)
                    self._mutex.acquire()
                    with self._record:
                        held = len(self.grants)
                        self.grants.append((pid, round(time.monotonic() - self._t0, 6), None))
                    conn.sendall(_GRANTED)
                elif cmd == _RELEASE and held is not None:
                    self._release(held)
                    held = None
                    conn.sendall(_RELEASED)
                else:  # end of stream, or a request out of order (acquire twice, release unheld): drop the client
                    return
        except OSError:
            return
        finally:
            if held is not None:
                self._release(held)
            conn.close()

    def _release(self, held) -> None:
        with self._record:
            pid, acquired, _ = self.grants[held]
            self.grants[held] = (pid, acquired, round(time.monotonic() - self._t0, 6))
        self._mutex.release()


class LockClient:
    """A worker's handle on a ``CountedLock``: ``acquire()``, ``release()``, ``with lock:``. Pickles as its address."""

    def __init__(self, address: str):
        self.address = address
        self._sock = None
        self._pid = None

    def __getstate__(self):
        return {"address": self.address}

    def __setstate__(self, state):
        self.__init__(state["address"])

    def _conn(self):
        if self._sock is None or self._pid != os.getpid():  # a forked child never shares its parent's connection
            sock = sockets.connect_unix(self.address)
            self._sock, self._pid = sock, os.getpid()
        return self._sock

    def _ask(self, cmd, expect) -> None:
        sock = self._conn()
        sock.sendall(cmd)
        if sock.recv(1) != expect:
            raise RuntimeError(f"the lock at {self.address} refused {'acquire' if cmd == _ACQUIRE else 'release'}: "
                               "acquire it once before releasing it, and release it before acquiring it again")

    def acquire(self) -> bool:
        self._ask(_ACQUIRE, _GRANTED)
        return True

    def release(self) -> None:
        self._ask(_RELEASE, _RELEASED)

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()

    def __repr__(self):
        return f"<LockClient {os.path.basename(self.address)}>"
