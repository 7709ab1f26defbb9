"""The relay's server: one thread per rank's connection in the launching process, which moves the bytes, records
each call in a ``Traffic`` and serves collectives with ``collectives.combine``."""
from __future__ import annotations

import os
import tempfile
import threading

from lab_utils import sockets
from lab_utils.launcher import wire
from lab_utils.launcher.relay import collectives
from lab_utils.launcher.relay.api import (BACKEND, MAX_BUFFERED, MAX_CONNECTIONS_PER_RANK, MAX_HEADER, MAX_PAYLOAD,
                                          RelayError)


class Relay:
    """The relay thread for one launch: accepts the ranks' connections, moves bytes, records calls in ``traffic``
    (a ``Traffic``: anything with ``record(call)`` and ``keep_data``)."""

    BACKEND = BACKEND

    def __init__(self, traffic, world_size: int, directory: str | None = None):
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
        self._conns: list = []  # the ranks' connections, closed by stop
        self._stopped = False
        self._srv = sockets.listen_unix(self.address, mode=sockets.socket_mode(folder))
        threading.Thread(target=self._accept, name="dtlabs-relay", daemon=True).start()

    def stop(self) -> None:
        self._stopped = True
        with self._cond:
            self._cond.notify_all()
        sockets.close_unix(self.address, self._srv, *self._conns)
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
                header, payload = wire.recv_message(conn, MAX_HEADER, MAX_PAYLOAD)
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
                    call = collectives.describe(rank, header, payload, self.traffic.keep_data)
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
        except (OSError, ValueError):  # a frame over its limit (wire.FrameTooLarge), a header that is not JSON
            return
        finally:
            conn.close()

    def _reply(self, conn, lock, header, payload=b"", error=None) -> None:
        try:
            with lock:
                wire.send_message(conn, {"id": header.get("id"), "error": error}, payload)
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
                    slot["out"] = collectives.combine(group, slot["in"])
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
