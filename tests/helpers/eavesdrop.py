"""What another local user can hear: run as that user (standard library only, so any Python they can run will do),
it connects to every Unix socket (files and abstract names, from /proc/net/unix) and every TCP port listening on
loopback (/proc/net/tcp, tcp6) it can reach, subscribes to everything as a ZeroMQ SUB socket would (ZMTP 3.1, the
NULL mechanism: an IOPub channel publishes to any subscriber, no key asked) and reads for ``SECONDS``. Endpoints are
looked for again every half second, so one that appears while it listens is reached too.

    python eavesdrop.py [--speak] [--proc] [--stdin] [--ready] SECONDS [NEEDLE...]

- ``--speak``: besides subscribing, every TCP port a process can be given by binding port 0 (the machine's
  ip_local_port_range: rendezvous stores, gloo, kernels and servers started on port 0) or torch's default rendezvous
  ports (29400-29600) is also sent an HTTP request, and spoken to as a torch ``TCPStore`` client would (validate,
  ping; then every key it lists and each key's value, again every half second for new keys), and what comes back is
  read. (Fixed service ports are left alone.)
- ``--proc``: every other user's process in /proc is read as far as it lets us: cmdline, environ, status, maps, the
  fd and fdinfo folders, its network namespace's tcp/tcp6/unix tables (whose endpoints are then tried too), and so on.
- ``--stdin``: the needles are a JSON list on stdin's first line (then they are in no process's command line, where
  ``--proc`` would read them), and the scan ends at stdin's next line or end, or after ``SECONDS``.
- ``--ready``: says ``ready`` on stderr once the first round of connections has been tried.
- a needle ``hex:<hex digits>`` is looked for as those raw bytes (a tensor's float32 values), any other as its UTF-8.

Prints one JSON object: ``reached`` (endpoints that accepted a connection), ``heard`` (endpoints, or /proc files,
whose bytes contained a needle, with the needle), ``bytes`` (all bytes received), ``uid``; with ``--speak``, ``spoke``
(endpoints that answered a TCPStore or HTTP request, with the bytes they sent) and ``store_keys`` (keys read from
TCPStores); with ``--proc``, ``proc`` (pids looked at, files read and refused, bytes read)."""
from __future__ import annotations

import json
import os
import socket
import struct
import sys
import threading
import time

GREETING = b"\xff" + b"\x00" * 8 + b"\x7f" + bytes([3, 1]) + b"NULL".ljust(20, b"\x00") + b"\x00" + b"\x00" * 31
MAX_ENDPOINTS = 500
# torch.distributed's TCPStore wire protocol (c10d TCPStoreBackend.hpp): a one-byte query type, little-endian values
STORE_MAGIC, VALIDATE, GET, PING, LIST_KEYS = 0x3C85F7CE, 0, 3, 13, 17
HTTP = b"GET / HTTP/1.0\r\nHost: localhost\r\n\r\n"
PROC_FILES = ("cmdline", "comm", "environ", "status", "stat", "maps", "smaps", "io", "stack", "syscall", "wchan",
              "sched", "limits", "cgroup", "mountinfo", "net/tcp", "net/tcp6", "net/unix", "net/udp", "mem")


def _command(name: bytes, props: dict) -> bytes:
    body = bytes([len(name)]) + name + b"".join(
        bytes([len(k)]) + k + struct.pack("!I", len(v)) + v for k, v in props.items())
    return bytes([0x04, len(body)]) + body


def _tables(root: str) -> list:
    """The listening endpoints in the unix, tcp and tcp6 tables under ``root`` (/proc/net, or /proc/PID/net)."""
    found = []
    try:
        with open(f"{root}/unix") as fh:
            for line in fh.readlines()[1:]:
                parts = line.split()
                if len(parts) >= 8 and parts[5] == "01":  # listening
                    path = parts[7]
                    found.append(("unix", "\0" + path[1:] if path.startswith("@") else path))
    except OSError:
        pass
    for name, host in (("tcp", "127.0.0.1"), ("tcp6", "::1")):
        try:
            lines = open(f"{root}/{name}").readlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            if state == "0A":  # LISTEN
                found.append((name, (host, int(local.rsplit(":", 1)[1], 16))))
    return found


def _spoken_ports() -> set:
    try:
        low, high = map(int, open("/proc/sys/net/ipv4/ip_local_port_range").read().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return set(range(low, high + 1)) | set(range(29400, 29601))


def endpoints(with_procs: bool = False) -> list:
    found = _tables("/proc/net")
    if with_procs:  # what other processes' network namespaces list (tried from ours: the same ones if they share it)
        for pid in _pids():
            found += _tables(f"/proc/{pid}/net")
    return list(dict.fromkeys(found))


def _pids() -> list:
    me = os.getuid()
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid != me:
                    out.append(name)
            except OSError:
                pass
    return out


class Scan:
    def __init__(self, needles: list, stop: threading.Event):
        self.needles = [bytes.fromhex(n[4:]) if n.startswith("hex:") else n.encode() for n in needles]
        self.names = list(needles)
        self.stop = stop
        self.lock = threading.Lock()
        self.out = {"reached": [], "heard": [], "bytes": 0, "uid": os.getuid()}

    def found(self, where: str, got: bytes) -> None:
        with self.lock:
            self.out["bytes"] += len(got)
            for needle, name in zip(self.needles, self.names):
                if needle in got:
                    self.out["heard"].append([where, name])

    def _connect(self, kind, address):
        family = socket.AF_UNIX if kind == "unix" else socket.AF_INET if kind == "tcp" else socket.AF_INET6
        s = socket.socket(family, socket.SOCK_STREAM)
        s.settimeout(1)
        try:
            s.connect(address)
            return s
        except OSError:
            s.close()
            return None

    def _read(self, s, until_stop: bool, limit_s: float = 1.0) -> bytes:
        got, end = b"", time.monotonic() + limit_s
        while not self.stop.is_set() and (until_stop or time.monotonic() < end):
            s.settimeout(0.2)
            try:
                chunk = s.recv(1 << 16)
            except socket.timeout:
                continue
            except OSError:
                break
            if not chunk:
                break
            got += chunk
        return got

    def subscribe(self, kind, address) -> None:
        s = self._connect(kind, address)
        if s is None:
            return
        name = f"{kind}:{address!r}"
        with self.lock:
            self.out["reached"].append(name)
        got = b""
        try:
            s.sendall(GREETING)
            while len(got) < len(GREETING) and not self.stop.is_set():  # the peer's greeting, then the handshake
                s.settimeout(0.5)
                try:
                    chunk = s.recv(len(GREETING) - len(got))
                except socket.timeout:
                    continue
                if not chunk:
                    break
                got += chunk
            s.sendall(_command(b"READY", {b"Socket-Type": b"SUB"}) + _command(b"SUBSCRIBE", {}))  # to every topic
            got += self._read(s, until_stop=True)
        except OSError:
            pass
        finally:
            s.close()
        self.found(name, got)

    def speak(self, kind, address) -> None:
        """As an HTTP client, then as a TCPStore client: every key and its value, and again every half second for
        the keys set since (a rendezvous store is made before its ranks write to it); what comes back."""
        name = f"{kind}:{address!r}"
        answered = b""
        s = self._connect(kind, address)
        if s is not None:
            try:
                s.sendall(HTTP)
                answered += self._read(s, until_stop=False)
            except OSError:
                pass
            finally:
                s.close()
        s = self._connect(kind, address)
        if s is not None:
            try:
                s.sendall(bytes([VALIDATE]) + struct.pack("<I", STORE_MAGIC) + bytes([PING]) + struct.pack("<I", 4242))
                s.settimeout(1)
                if _exact(s, 4) == struct.pack("<I", 4242):  # a TCPStore
                    answered += b"ping"
                    read = set()
                    while True:
                        s.sendall(bytes([LIST_KEYS]))
                        keys = [_exact(s, struct.unpack("<Q", _exact(s, 8))[0])
                                for _ in range(min(struct.unpack("<Q", _exact(s, 8))[0], 1000))]
                        for key in keys:
                            if key not in read:
                                read.add(key)
                                s.sendall(bytes([GET]) + struct.pack("<Q", len(key)) + key)
                                answered += key + _exact(s, struct.unpack("<Q", _exact(s, 8))[0])
                                with self.lock:
                                    self.out["store_keys"] += 1
                        if self.stop.wait(0.5):
                            break
            except (OSError, EOFError, struct.error, MemoryError, OverflowError):
                pass
            finally:
                s.close()
        if answered:
            with self.lock:
                self.out["spoke"].append([name, len(answered)])
        self.found(name, answered)

    def read_proc(self) -> None:
        """Every other user's process, each file once: what /proc lets another user read of it."""
        seen = set()
        while not self.stop.is_set():
            for pid in _pids():
                if pid in seen:
                    continue
                seen.add(pid)
                for rel in PROC_FILES:
                    self._proc_file(f"/proc/{pid}/{rel}")
                for rel in ("cwd", "root", "exe", "ns/net"):
                    self._proc_link(f"/proc/{pid}/{rel}")
                for folder in ("fd", "fdinfo", "map_files"):
                    try:
                        entries = os.listdir(f"/proc/{pid}/{folder}")
                    except OSError:
                        self.out["proc"]["refused"] += 1
                        continue
                    for entry in entries:
                        (self._proc_link if folder != "fdinfo" else self._proc_file)(f"/proc/{pid}/{folder}/{entry}")
                self.out["proc"]["pids"] += 1
            self.stop.wait(1.0)

    def _proc_file(self, path: str) -> None:
        try:
            with open(path, "rb") as fh:
                got = fh.read(1 << 20)
        except OSError:
            self.out["proc"]["refused"] += 1
            return
        self.out["proc"]["read"] += 1
        self.out["proc"]["bytes"] += len(got)
        self.found(f"proc:{path}", got)

    def _proc_link(self, path: str) -> None:
        try:
            got = os.readlink(path).encode()
        except OSError:
            self.out["proc"]["refused"] += 1
            return
        self.out["proc"]["read"] += 1
        self.found(f"proc:{path}", got)


def _exact(s, n: int) -> bytes:
    if n > 1 << 24:
        raise OverflowError(n)
    got = b""
    while len(got) < n:
        chunk = s.recv(n - len(got))
        if not chunk:
            raise EOFError(len(got))
        got += chunk
    return got


def main(argv):
    flags = {a for a in argv if a.startswith("--")}
    rest = [a for a in argv if not a.startswith("--")]
    unknown = flags - {"--speak", "--proc", "--stdin", "--ready"}
    if unknown or not rest:
        sys.exit(f"usage: eavesdrop.py [--speak] [--proc] [--stdin] [--ready] SECONDS [NEEDLE...] ({unknown or ''})")
    seconds, needles = float(rest[0]), rest[1:]
    stop = threading.Event()
    if "--stdin" in flags:
        needles += json.loads(sys.stdin.readline())

        def until_told():
            sys.stdin.readline()
            stop.set()

        threading.Thread(target=until_told, daemon=True).start()
    scan = Scan(needles, stop)
    threading.Timer(seconds, stop.set).start()
    speak, proc = "--speak" in flags, "--proc" in flags
    if speak:
        scan.out.update(spoke=[], store_keys=0)
    threads = []
    if proc:
        scan.out["proc"] = {"pids": 0, "read": 0, "refused": 0, "bytes": 0}
        threads.append(threading.Thread(target=scan.read_proc, daemon=True))
        threads[-1].start()
    tried, ready, spoken = set(), "--ready" not in flags, _spoken_ports()
    t0, rounds = time.monotonic(), 0
    while not stop.is_set():
        rounds += 1
        for kind, address in endpoints(with_procs=proc and rounds % 4 == 1):  # other namespaces' every 2 s
            if (kind, address) in tried or len(tried) >= MAX_ENDPOINTS:
                continue
            tried.add((kind, address))
            jobs = [scan.subscribe] + ([scan.speak] if speak and kind != "unix" and address[1] in spoken else [])
            for job in jobs:
                threads.append(threading.Thread(target=job, args=(kind, address), daemon=True))
                threads[-1].start()
        if not ready:
            print("ready", file=sys.stderr, flush=True)
            ready = True
        stop.wait(0.5)
    for t in threads:
        t.join(5)
    scan.out["endpoints"] = len(tried)
    scan.out["seconds"] = round(time.monotonic() - t0, 1)
    print(json.dumps(scan.out), flush=True)
    os._exit(0)  # the timer and the stdin reader may still be waiting


if __name__ == "__main__":
    main(sys.argv[1:])
