"""Process plumbing shared by the grader and the sandbox: find a tree of processes, kill it, adopt orphans.

Processes are found two ways: by ancestry (``tree``: a process and its descendants, plus orphans re-parented
to us when we are a child subreaper) and by an environment token (``with_token``: every process started
under a marker variable, however it detached). Killing is always SIGKILL to the process group first, then to
each process, and never touches a process that was not found one of those two ways.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux), so double-forked ones stay findable."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def killpg_quiet(pgid: int, sig: int = signal.SIGKILL) -> None:
    """Signal a process group that may already be gone; never our own."""
    try:
        if pgid > 0 and pgid != os.getpgid(0):
            os.killpg(pgid, sig)
    except OSError:
        pass


def tree(pid: int, include_orphans: bool = False) -> list:
    """``pid`` and its live descendants; with ``include_orphans`` also every descendant of this process."""
    import psutil

    found = {}
    try:
        root = psutil.Process(pid)
        for p in [root, *root.children(recursive=True)]:
            found[p.pid] = p
    except psutil.Error:
        pass
    if include_orphans:
        try:
            for p in psutil.Process().children(recursive=True):
                found.setdefault(p.pid, p)
        except psutil.Error:
            pass
    alive = []
    for p in found.values():
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except psutil.Error:
            pass
    return alive


def kill_procs(procs, wait_s: float = 5.0) -> list[str]:
    """SIGKILL each process and the groups they lead; returns a description of each one killed."""
    import psutil

    killed, groups = [], set()
    for p in procs:
        try:
            killed.append(f"{p.pid} {p.name()} {' '.join(p.cmdline())[:120]}")
            if os.getpgid(p.pid) == p.pid:
                groups.add(p.pid)
        except (psutil.Error, OSError):
            continue
    for g in groups:
        killpg_quiet(g)
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(list(procs), timeout=wait_s)
    return killed


def kill_tree(pid: int, include_orphans: bool = False) -> list[str]:
    """Kill ``pid``'s group and every process of its tree (see ``tree``)."""
    killpg_quiet(pid)
    return kill_procs(tree(pid, include_orphans))


def with_token(token: str, var: str, exclude=()) -> list:
    """Live processes whose environment carries ``var=token`` (psutil.Process objects)."""
    import psutil

    skip = {os.getpid(), *exclude}
    found = []
    for proc in psutil.process_iter(["pid"]):
        if proc.pid in skip:
            continue
        try:
            if proc.environ().get(var) == token and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def reap_token(token: str, var: str, grace_s: float = 0.0) -> list[str]:
    """Kill every process carrying ``var=token`` after giving them ``grace_s`` to exit; returns what was killed."""
    deadline = time.monotonic() + grace_s
    procs = with_token(token, var)
    while procs and time.monotonic() < deadline:
        time.sleep(0.2)
        procs = with_token(token, var)
    return kill_procs(procs)
