"""What another local user can hear: run as that user (standard library only, so any Python they can run will do),
it connects to every Unix socket (files and abstract names, from /proc/net/unix) and every TCP port listening on
loopback (/proc/net/tcp, tcp6) it can reach, subscribes to everything as a ZeroMQ SUB socket would (ZMTP 3.1, the
NULL mechanism: an IOPub channel publishes to any subscriber, no key asked) and reads for ``SECONDS``.

    python eavesdrop.py SECONDS NEEDLE [NEEDLE...]

Prints one JSON object: ``reached`` (endpoints that accepted a connection), ``heard`` (endpoints that sent bytes
containing a needle, with the needle) and ``bytes`` (all bytes received)."""
from __future__ import annotations

import json
import os
import socket
import struct
import sys
import threading
import time

GREETING = b"\xff" + b"\x00" * 8 + b"\x7f" + bytes([3, 1]) + b"NULL".ljust(20, b"\x00") + b"\x00" + b"\x00" * 31


def _command(name: bytes, props: dict) -> bytes:
    body = bytes([len(name)]) + name + b"".join(
        bytes([len(k)]) + k + struct.pack("!I", len(v)) + v for k, v in props.items())
    return bytes([0x04, len(body)]) + body


def endpoints() -> list:
    found = []
    with open("/proc/net/unix") as fh:
        for line in fh.readlines()[1:]:
            parts = line.split()
            if len(parts) >= 8 and parts[5] == "01":  # listening
                path = parts[7]
                found.append(("unix", "\0" + path[1:] if path.startswith("@") else path))
    for name, family, host in (("tcp", socket.AF_INET, "127.0.0.1"), ("tcp6", socket.AF_INET6, "::1")):
        try:
            lines = open(f"/proc/net/{name}").readlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            if state == "0A":  # LISTEN
                found.append((name, (host, int(local.rsplit(":", 1)[1], 16))))
    return list(dict.fromkeys(found))


def listen(kind, address, deadline, needles, out):
    family = socket.AF_UNIX if kind == "unix" else socket.AF_INET if kind == "tcp" else socket.AF_INET6
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(1)
    try:
        s.connect(address)
    except OSError:
        s.close()
        return
    name = f"{kind}:{address!r}"
    out["reached"].append(name)
    got = b""
    try:
        s.sendall(GREETING)
        while len(got) < len(GREETING) and time.monotonic() < deadline:  # the peer's greeting, then the handshake
            chunk = s.recv(len(GREETING) - len(got))
            if not chunk:
                break
            got += chunk
        s.sendall(_command(b"READY", {b"Socket-Type": b"SUB"}) + _command(b"SUBSCRIBE", {}))  # to every topic
        while time.monotonic() < deadline:
            s.settimeout(max(0.05, deadline - time.monotonic()))
            try:
                chunk = s.recv(1 << 16)
            except socket.timeout:
                break
            if not chunk:
                break
            got += chunk
    except OSError:
        pass
    finally:
        s.close()
    out["bytes"] += len(got)
    for needle in needles:
        if needle.encode() in got:
            out["heard"].append([name, needle])


def main(argv):
    seconds, needles = float(argv[0]), argv[1:]
    deadline = time.monotonic() + seconds
    out = {"reached": [], "heard": [], "bytes": 0, "uid": os.getuid()}
    threads = [threading.Thread(target=listen, args=(k, a, deadline, needles, out), daemon=True)
               for k, a in endpoints()[:500]]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 3)
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
