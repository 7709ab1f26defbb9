"""Process plumbing shared by the launcher, the grader and the sandbox: find a tree of processes, kill it,
adopt orphans, die with a parent, name a process, pump a pipe's lines.

Processes are found two ways: by ancestry (``tree``: a process and its descendants, plus orphans re-parented
to us when we are a child subreaper) and by an environment token (``with_token``: every process started
under a marker variable, however it detached). Killing is always SIGKILL to the process group first (one the
process leads, or one whose leader is gone), then to each process found one of those two ways.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent  # the lab_utils package this process imported


def python_path(extra: str | None = None) -> str:
    """A PYTHONPATH under which a child ``python -m lab_utils...`` imports this same package (an editable install
    or a plain checkout included), before ``extra`` (the caller's own PYTHONPATH)."""
    return os.pathsep.join(p for p in (str(PACKAGE_DIR.parent), extra) if p)


# libgomp (torch's OpenMP) lets a thread that finishes a parallel region first spin for the others. Where processes
# share the cores (a grading's kernel, sandboxed subject and ranks; gradings side by side; the test suite's workers),
# the spinning thread burns the core the one it waits for needs: the same work in 2 and 4 processes on 2 cores took
# 1.8x and 2.5x the CPU-seconds (benchmarks/bench_shared_cores.py). PASSIVE sleeps instead. numpy's OpenBLAS does
# the same with its worker threads: each spins 2^28 cycles (about 0.1 s) waiting for work before it sleeps, at
# start and after every threaded call, so each process that imports numpy (torch does) burnt 0.1 CPU-s for nothing:
# 0.18 against 0.08 CPU-s for `import numpy`, 0.20 against 0.07 for a forked grader kernel's start. A timeout of 2^4
# cycles sleeps at once. A value the user set wins.
SHARED_CORES_ENV = {"OMP_WAIT_POLICY": "PASSIVE", "OPENBLAS_THREAD_TIMEOUT": "4"}


def share_cores(env: dict) -> dict:
    """``env`` with ``SHARED_CORES_ENV`` where it sets nothing else; for processes that run beside others. Only
    before the process imports torch: libgomp reads it once."""
    for key, value in SHARED_CORES_ENV.items():
        env.setdefault(key, value)
    return env


PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38


@functools.cache
def libc():
    """The C library, opened once: a child between fork and exec (a ``preexec_fn``) must not ``dlopen``, whose lock
    another thread of its parent may have held at the fork."""
    return ctypes.CDLL(None, use_errno=True)


def _prctl(option: int, arg) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        return libc().prctl(option, arg, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def set_name(name: str) -> None:
    """Name this process (what ps/psutil show as its name, 15 bytes at most), so tests and students find it."""
    _prctl(PR_SET_NAME, name.encode()[:15])


def die_with_parent(expected_parent: int, sig: int = signal.SIGKILL, watch_s: float | None = None) -> None:
    """Get ``sig`` when our parent dies (Linux ``PR_SET_PDEATHSIG``); exit now if it already has. ``watch_s``: a
    thread also exits this process once the parent is gone (other systems; a second defence after a fork)."""
    _prctl(PR_SET_PDEATHSIG, int(sig))
    if os.getppid() != expected_parent:  # the parent died before prctl took effect
        os._exit(1)
    if watch_s:
        def watch():
            while True:
                time.sleep(watch_s)
                if os.getppid() != expected_parent:
                    os._exit(1)

        threading.Thread(target=watch, name="dtlabs-parent-watch", daemon=True).start()


@contextlib.contextmanager
def collector_off_while_importing():
    """Heavy imports (torch) with the cyclic collector off, their objects then frozen (``gc.freeze``): importing torch
    set off collection after collection over objects that live as long as the process, 30 % of the import's CPU
    (benchmarks/bench_import_gc.py), and every later full collection would walk them again. (A fork server keeps the
    collector off for good instead, as Python's gc docs advise, and turns it on in each child.)"""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was:
            gc.enable()


class ForkedChild:
    """``target(*args)`` in a child made with ``os.fork``, behind the three ``Popen`` methods callers use (``poll``,
    ``send_signal``, ``wait``), so a forked helper and a spawned one are handled alike. The child ends with
    ``os._exit`` when ``target`` returns (0) or raises (1, traceback on stderr): never in the parent's atexit or code."""

    def __init__(self, target, *args):
        sys.stdout.flush()
        sys.stderr.flush()
        self.returncode: int | None = None
        self.pid = os.fork()
        if self.pid == 0:
            code = 1
            try:
                target(*args)
                code = 0
            except BaseException:  # noqa: BLE001 - the child must never unwind into the parent's code
                import traceback

                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: gone, status unknown (Popen says 0 too)
                self.returncode = 0
                return 0
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
            time.sleep(0.01)
        return self.returncode


def reap_children() -> list[tuple[int, int]]:
    """Every child of this process that has ended, reaped now without waiting: (pid, exit code as ``Popen`` gives it,
    negative for a signal). For fork servers, which learn of their children's ends from SIGCHLD."""
    ended = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        ended.append((pid, os.waitstatus_to_exitcode(status)))
    return ended


def pump_lines(fd: int, on_line, on_eof=None) -> threading.Thread:
    """A daemon thread that reads ``fd`` to EOF, calling ``on_line(text)`` per line (and a last partial one),
    then ``on_eof()``."""
    def pump():
        buf = b""
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                chunk = b""
            if not chunk:
                break
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                on_line(line.decode(errors="replace"))
        if buf:
            on_line(buf.decode(errors="replace"))
        if on_eof is not None:
            on_eof()

    t = threading.Thread(target=pump, name="dtlabs-pump", daemon=True)
    t.start()
    return t


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux), so double-forked ones stay findable."""
    return _prctl(PR_SET_CHILD_SUBREAPER, 1)


def set_no_new_privs() -> bool:
    """No program this process or its descendants run gains privileges (setuid bits are ignored; Linux), as
    entering a Landlock domain without privilege requires."""
    return _prctl(PR_SET_NO_NEW_PRIVS, 1)


def killpg_quiet(pgid: int, sig: int = signal.SIGKILL) -> None:
    """Signal a process group that may already be gone; never our own."""
    try:
        if pgid > 0 and pgid != os.getpgid(0):
            os.killpg(pgid, sig)
    except OSError:
        pass


def kill_group_and_pid(pid: int | None, sig: int = signal.SIGKILL) -> None:
    """Signal the process group ``pid`` leads and ``pid`` itself, ignoring whichever is gone."""
    if pid is None:
        return
    killpg_quiet(pid, sig)
    try:
        os.kill(pid, sig)
    except OSError:
        pass


def kill_leader(p) -> None:
    """SIGKILL psutil process ``p`` and its process group where ``p`` leads it (a torchrun worker leads its own
    session) or the group's leader is gone: that group is a chain that forks and exits (a "hopper"), and one killpg
    takes all of it, the child forked since the scan included (a leader's pid is not reused while its group has
    members). A group whose leader lives on (a kernel's, a shell's) is left to the caller's scan."""
    import psutil

    try:
        pgid = os.getpgid(p.pid)
        if pgid == p.pid or not psutil.pid_exists(pgid) or psutil.Process(pgid).status() == psutil.STATUS_ZOMBIE:
            killpg_quiet(pgid)
    except (psutil.Error, OSError):  # gone between two looks: what is left of the chain is found again
        pass
    with contextlib.suppress(psutil.Error):
        p.kill()


def children_of(pid: int) -> list[int] | None:
    """``pid``'s children, from the kernel's per-thread lists (``/proc/PID/task/TID/children``); [] when ``pid`` is
    gone, None where the kernel keeps no such lists."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    kids = []
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                kids += [int(x) for x in fh.read().split()]
        except (OSError, ValueError):  # the thread ended, or the kernel has no such lists (no CONFIG_PROC_CHILDREN)
            if not os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children"):
                return None
    return kids


def _descendant_pids(pid: int) -> list[int] | None:
    """``pid``'s descendants (``children_of``, level by level): reads in proportion to the tree, where psutil reads
    every process on the machine (a sandbox's watchdog asks ten times a second). None where the kernel has no lists."""
    found, todo = [], [pid]
    while todo:
        kids = children_of(todo.pop())
        if kids is None:
            return None
        found += kids
        todo += kids
    return found


def descendants(pid: int) -> list:
    """``pid``'s live and zombie descendants (psutil processes), found from ``pid`` down (``_descendant_pids``)."""
    import psutil

    pids = _descendant_pids(pid)
    if pids is None:
        return psutil.Process(pid).children(recursive=True)
    out = []
    for child in pids:
        try:
            out.append(psutil.Process(child))
        except psutil.Error:
            pass
    return out


def tree(pid: int, include_orphans: bool = False) -> list:
    """``pid`` and its live descendants; with ``include_orphans`` also every descendant of this process."""
    import psutil

    found = {}
    try:
        root = psutil.Process(pid)
        for p in [root, *descendants(pid)]:
            found[p.pid] = p
    except psutil.Error:
        pass
    if include_orphans:
        try:
            for p in descendants(os.getpid()):
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


def kill_descendants(pid: int | None = None) -> list[str]:
    """Kill every live descendant of ``pid`` (default: this process) and the groups they lead."""
    import psutil

    try:
        procs = descendants(pid or os.getpid())
    except psutil.Error:
        return []
    return kill_procs(procs, wait_s=0)


def kill_tree(pid: int, include_orphans: bool = False) -> list[str]:
    """Kill ``pid``'s group and every process of its tree (see ``tree``)."""
    killpg_quiet(pid)
    return kill_procs(tree(pid, include_orphans))


def kill_until_none(find, what: str, deadline_s: float = 10.0) -> list[str]:
    """SIGKILL each process ``find()`` yields (and its group, ``kill_leader``) as it is yielded, until two scans 50 ms
    apart find none: one snapshot misses what forks between scan and kill. The pids killed; RuntimeError after
    ``deadline_s``."""
    import psutil

    killed, empty, end = {}, 0, time.monotonic() + deadline_s
    while empty < 2:
        found = [p for p in find() if kill_leader(p) or True]  # each killed as found: a hopper lives a fork's time
        killed.update((p.pid, p) for p in found)
        empty = 0 if found else empty + 1
        if found and time.monotonic() > end:
            raise RuntimeError(f"{what} still ran after {deadline_s:g} s of killing: pids {[p.pid for p in found[:5]]}")
        time.sleep(0.002 if found else 0.05)
    psutil.wait_procs(list(killed.values()), timeout=0.5)  # reaps those that are our children
    return [str(pid) for pid in killed]


def with_token(token: str, var: str, exclude=(), lazily: bool = False):
    """Live processes whose environment carries ``var=token`` (psutil.Process objects); ``lazily``: as found."""
    import psutil

    def scan():
        for proc in psutil.process_iter(["pid"]):
            try:
                if proc.pid not in skip and proc.environ().get(var) == token and proc.status() != psutil.STATUS_ZOMBIE:
                    yield proc
            except (psutil.Error, OSError):
                continue

    skip = {os.getpid(), *exclude}
    return scan() if lazily else list(scan())


def reap_token(token: str, var: str, grace_s: float = 0.0) -> list[str]:
    """Kill every process carrying ``var=token`` after giving them ``grace_s`` to exit; returns what was killed."""
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and with_token(token, var):
        time.sleep(0.2)
    return kill_until_none(lambda: with_token(token, var, lazily=True), f"processes carrying {var}")
