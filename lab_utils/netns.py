"""A network of the ranks' own: the zygote enters a new user and network namespace before it imports anything, so
every rank it forks, and the rendezvous store it hosts for them, listen on a loopback no other process can reach.

Why: on a shared machine (the course's JupyterHub, a lab server) a student's ranks listen on TCP ports: the
``TCPStore`` rendezvous and gloo's pairs. On the machine's loopback any local user can connect to them, read or set
the store's keys, or race a peer for a gloo pair. In a namespace of their own there is no port to find.

Only where the machine lets an ordinary user make namespaces (``unshare -Urn``): a container that refuses them
(Docker's default seccomp profile, ``kernel.unprivileged_userns_clone=0``, AppArmor's userns restriction) leaves the
ranks on the machine's loopback, and ``dtlabs doctor`` says so. The namespace maps the user to itself; the
capabilities it grants reach no further than itself (what ``unshare -Urn`` gives any user), and the zygote keeps
them: it reads the environment of what its ranks start, programs they exec'd included. Stdlib only: the zygote
calls it before ``import torch``.

Other processes of the same student join that network when they start (``join``, in the child between fork and
exec): torchrun's agents and their workers (``lab_utils.labkit.torchrun``), and the warm servers that fork them. The
owner of a user namespace may enter it (``setns``), as ``nsenter --preserve-credentials`` does; nobody else may.
"""
from __future__ import annotations

import ctypes
import fcntl
import os
import socket
import struct
import sys

CLONE_NEWUSER, CLONE_NEWNET, CLONE_NEWUTS, CLONE_NEWNS = 0x10000000, 0x40000000, 0x04000000, 0x00020000
JOIN_VAR = "DTLABS_NETNS_OF"  # a process's environment: the pid whose network it joins when it starts (``preexec``)
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
_IFREQ = struct.Struct("16sH14x")
PRIVATE = "private"  # what ``enter`` returns when the ranks' network is their own
# c10d warns on every connection that it cannot name the peer (a v4-mapped address, asked of a DNS server that a
# network of its own cannot reach): without this, every rank of every launch printed it into the cell
LOG_LEVEL = "ERROR"


def enter() -> str:
    """Move this (single-threaded) process into a new user and network namespace with its loopback up. Returns
    ``PRIVATE``, or why the process stays on the machine's network (nothing has changed then).

    It is tried first in a child, which exits: a namespace made but left without a loopback (an AppArmor profile
    that grants no capability in it) must never be this process's."""
    if not sys.platform.startswith("linux"):
        return f"shared: {sys.platform} has no network namespaces"
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the trial
        os.close(r)
        why = _enter_here()
        os.write(w, why.encode()[:500])
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as fh:
        why = fh.read().decode(errors="replace")
    os.waitpid(pid, 0)
    if why != PRIVATE:
        return f"shared: {why or 'the trial died'}"
    why = _enter_here()
    return why if why == PRIVATE else f"shared: {why}"


def _enter_here() -> str:
    uid, gid = os.getuid(), os.getgid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:
        return f"this machine refuses new namespaces to an ordinary user ({os.strerror(ctypes.get_errno())})"
    try:
        for name, text in (("uid_map", f"{uid} {uid} 1"), ("setgroups", "deny"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as fh:
                fh.write(text)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            flags = _IFREQ.unpack(fcntl.ioctl(s, SIOCGIFFLAGS, _IFREQ.pack(b"lo", 0)))[1]
            fcntl.ioctl(s, SIOCSIFFLAGS, _IFREQ.pack(b"lo", flags | IFF_UP))
    except OSError as exc:
        return f"the new namespace could not be set up ({exc.strerror or exc})"
    return PRIVATE



def joinable(pid: int) -> bool:
    """Whether a process of this user started now can join ``pid``'s user and network namespaces: they differ from
    this process's own, and their files open (a process that is not dumpable, or another user's, refuses)."""
    try:
        if os.readlink(f"/proc/{pid}/ns/net") == os.readlink("/proc/self/ns/net"):
            return False
        for ns in ("user", "net"):
            os.close(os.open(f"/proc/{pid}/ns/{ns}", os.O_RDONLY))
    except OSError:
        return False
    return True


def join(pid: int, kinds=("user", "net")) -> None:
    """Enter process ``pid``'s namespaces ``kinds``, its user namespace first, which grants the rights to enter the
    others: in a single-threaded process (a child between fork and exec), before it opens a socket. The working
    folder is kept (entering a mount namespace resets it). OSError if one is refused."""
    flags = {"user": CLONE_NEWUSER, "net": CLONE_NEWNET, "uts": CLONE_NEWUTS, "mnt": CLONE_NEWNS}
    cwd = os.getcwd()
    libc = ctypes.CDLL(None, use_errno=True)
    for ns in kinds:
        fd = os.open(f"/proc/{pid}/ns/{ns}", os.O_RDONLY)
        try:
            if libc.setns(fd, flags[ns]) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"could not join process {pid}'s {ns} namespace: {os.strerror(err)}")
        finally:
            os.close(fd)
    os.chdir(cwd)


def preexec(env: dict):
    """The ``preexec_fn`` that joins the network ``env[JOIN_VAR]`` names, or None where it names none."""
    pid = env.get(JOIN_VAR)
    return (lambda: join(int(pid))) if pid else None
