"""`dtlabs doctor --nodes HOST...`: what can be checked on one node before a multi-node job, so that a job does not
sit in a rendezvous until it times out.

For every host named (the first is the master: ``MASTER_ADDR``, or the ``--rdzv-endpoint`` host):
- its name resolves, and not to a loopback address (Debian's installer maps the machine's own name to 127.0.1.1:
  gloo then tells its peers to connect to 127.0.1.1, and each peer reaches itself);
- the interface this node would use toward it (the kernel's route), and whether ``GLOO_SOCKET_IFNAME`` /
  ``NCCL_SOCKET_IFNAME`` name an interface that exists and carries that address;
- with ``--port``, the master's port answers (refused: nothing listens yet; no answer: a firewall drops it).
The versions that must match on every node (torch, gloo, NCCL) are printed: run the same command on each node and
compare. Stdlib and psutil only: no rank is started.
"""
from __future__ import annotations

import ipaddress
import os
import socket

from lab_utils.status import Status


def _resolve(name: str) -> list[str]:
    return sorted({info[4][0] for info in socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)})


def _route(address: str) -> str | None:
    """The local address this node sends from toward ``address`` (a UDP connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((address, 9))
            return s.getsockname()[0]
        except OSError:
            return None


def _interface_of(local: str) -> str | None:
    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == local for a in addrs):
            return name
    return None


def _port(address: str, port: int, timeout: float) -> str:
    with socket.socket() as s:
        s.settimeout(timeout)
        try:
            s.connect((address, port))
            return "open"
        except ConnectionRefusedError:
            return "refused"
        except (socket.timeout, TimeoutError):
            return "no answer"
        except OSError as exc:
            return exc.strerror or type(exc).__name__


def check_nodes(hosts, port: int | None = None, timeout: float = 3.0, out=print) -> Status:
    """Check ``hosts`` (the first is the master) from this node; print a line per finding. INCOMPLETE where a
    problem was found."""
    import torch
    import torch.distributed as dist

    problems = 0

    def bad(text):
        nonlocal problems
        problems += 1
        out(f"PROBLEM     {text}")

    me = socket.gethostname()
    out(f"this node   {me}: torch {torch.__version__}, gloo {dist.is_gloo_available()}, "
        f"NCCL {'.'.join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else 'no GPU'} "
        "(run this on every node: these must match)")
    for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        if os.environ.get(var):
            out(f"{var:<11} {os.environ[var]}")
    for i, host in enumerate(hosts):
        role = "master" if i == 0 else "node"
        try:
            addresses = _resolve(host)
        except OSError as exc:
            bad(f"{host} ({role}) does not resolve: {exc.strerror or exc}. Use a name every node resolves "
                "(DNS or /etc/hosts), or its address")
            continue
        loop = [a for a in addresses if ipaddress.ip_address(a).is_loopback]
        if loop:
            bad(f"{host} ({role}) resolves to {', '.join(loop)}, a loopback address: a peer told to connect there "
                "reaches itself (Debian writes '127.0.1.1 HOSTNAME' into /etc/hosts). Map the name to the address "
                "the nodes share, or name the interface: GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME")
        address = next((a for a in addresses if a not in loop), addresses[0])
        local = _route(address)
        iface = _interface_of(local) if local else None
        out(f"{role:<11} {host} = {', '.join(addresses)}; this node reaches it from {local or '?'}"
            f" ({iface or 'no interface'})")
        if local is None:
            bad(f"no route from this node to {host} ({address})")
        for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
            named = os.environ.get(var)
            if named and iface and not loop and named != iface:
                bad(f"{var}={named}, but this node reaches {host} through {iface or 'no interface'}: the ranks "
                    "would listen where the other nodes cannot connect")
        if port and i == 0:
            answer = _port(address, port, timeout)
            out(f"port        {host}:{port} {answer}")
            if answer == "no answer":
                bad(f"nothing answered on {host}:{port} within {timeout:g} s: a firewall drops it (open the "
                    "rendezvous port and the ports gloo/NCCL pick between the nodes)")
            elif answer != "open":
                bad(f"{host}:{port} {answer}: nothing listens there yet (start the master's agent first, or check "
                    "--master-port / --rdzv-endpoint on every node)")
    return Status.INCOMPLETE if problems else Status.DONE
