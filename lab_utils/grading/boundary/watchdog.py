"""What one submission may use, and the watchdog that holds it to that in every mode: the total RSS of its
processes, their number and its folder's size, with the reason it stopped a box, so a grade can say "memory limit"
instead of "dead kernel"; and the kill that ends everything the submission started (a cgroup of its own, or a loop
until none is found)."""
from __future__ import annotations

import os
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

from lab_utils import cgroups, processes, settings
from lab_utils.grading import outcomes
from lab_utils.grading.boundary import separate_user


@dataclass
class Limits:
    """What one submission may use (``c.DTLabs.memory_mb`` / ``max_procs`` / ``disk_mb``; ``of`` takes them from a
    command's settings, the defaults are the settings' own). ``memory_mb`` is the total RSS of all its processes."""

    memory_mb: int = field(default_factory=lambda: settings.default("memory_mb"))
    max_procs: int = field(default_factory=lambda: settings.default("max_procs"))
    disk_mb: int = field(default_factory=lambda: settings.default("disk_mb"))
    poll_s: float = 0.1
    disk_every: int = 10  # polls between two measures of the submission's folder

    @classmethod
    def of(cls, dt) -> "Limits":
        """The limits of a command's settings (``settings.DTLabs``)."""
        return cls(memory_mb=dt.memory_mb, max_procs=dt.max_procs, disk_mb=dt.disk_mb)


def folder_bytes(folder: Path, stop_at: int) -> int:
    """Bytes under ``folder`` (no link followed), counted until they pass ``stop_at``; every 1000 entries count
    as a MB too, so a flood of empty files is caught as well."""
    total, entries, stack = 0, 0, [str(folder)]
    while stack and total <= stop_at:
        try:
            it = os.scandir(stack.pop())
        except OSError:
            continue
        with it:
            for entry in it:
                entries += 1
                try:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                    elif entry.is_file(follow_symlinks=False):
                        total += entry.stat(follow_symlinks=False).st_size
                except OSError:
                    continue  # gone while counted (a file the submission keeps replacing): the rest still counts
    return total + (entries // 1000 << 20)


def _memory(procs, kind: str) -> int:
    """Bytes of memory of ``procs``: ``rss`` (fast) or ``pss`` (shared pages divided among the processes mapping
    them, so a sum over processes counts each page once; read from /proc/PID/smaps_rollup)."""
    import psutil

    total = 0
    for p in procs:
        try:
            info = p.memory_full_info() if kind == "pss" else p.memory_info()
            total += getattr(info, kind, None) or info.rss
        except psutil.Error:
            pass
    return total


def reap_adopted(keep=()) -> int:
    """Reap this process's ended children of another session than its own, but ``keep`` (the box's own process,
    which its ``Popen`` reaps): the orphans it adopted as a subreaper. A submission that forks and exits in a loop (a
    hopper) leaves one such zombie per hop; unreaped they took every pid of the machine (kernel.pid_max), and every
    later fork or thread there failed. Returns how many were reaped."""
    session, reaped = os.getsid(0), 0
    for pid in processes.children_of(os.getpid()) or ():
        if pid in keep:
            continue
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                fields = fh.read().rpartition(b")")[2].split()  # state, ppid, pgrp, session, ...
            if fields[0] == b"Z" and int(fields[3]) != session and os.waitpid(pid, os.WNOHANG)[0]:
                reaped += 1
        except (OSError, ValueError, IndexError):
            continue
    return reaped


def limit_resources(memory_mb: int) -> None:  # runs in the child between fork and exec
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    # no POSIX message queue: one outlives its maker, and where /dev/mqueue is not mounted nothing can list or remove
    # it (a dead drop from one submission to the next of the same user, separate_user.SHARED_FOLDERS' blind spot)
    resource.setrlimit(resource.RLIMIT_MSGQUEUE, (0, 0))
    cap = memory_mb * 4 << 20  # address space per process: generous (torch reserves far more than it touches)
    try:
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    except (ValueError, OSError):
        pass


def own_cgroup() -> str | None:
    """This process's cgroup v2 folder (``0::PATH`` of /proc/self/cgroup under the mount of that hierarchy that
    holds it, found by ``lab_utils.cgroups``), or None where there is none."""
    own = cgroups.folders(cgroups.V2)
    return own[0] if own else None


class Cgroup(cgroups.Child):
    """A cgroup v2 made inside this process's own: what is moved into it, and everything that process then starts,
    stays in it (leaving needs write access to a cgroup's files), and ``kill`` ends them all at once, those forking
    while it runs included (``cgroup.kill``, Linux 5.14). ``make`` returns None where no such cgroup can be made here
    (no cgroup v2, a folder this user may not write, an older kernel). ``add``, ``pids``, ``kill`` and ``remove`` are
    ``lab_utils.cgroups.Child``'s."""

    def __init__(self, path: str):
        super().__init__(version=2, v2=path)

    @property
    def path(self) -> str:
        return self.v2

    @classmethod
    def make(cls, name: str) -> "Cgroup | None":
        parent = own_cgroup()
        if parent is None:
            return None
        path = os.path.join(parent, name)
        try:
            os.mkdir(path)
        except OSError:
            return None
        if not os.path.exists(os.path.join(path, "cgroup.kill")):
            cls(path).remove()
            return None
        return cls(path)


@dataclass
class Box:
    """A running sandboxed program, its watchdog, and why it was stopped (if it was)."""

    popen: subprocess.Popen
    mode: str
    limits: Limits
    reason: str | None = None
    caller_baseline: int | None = None  # the starting process's RSS at the start, when its growth counts too
    workdir: Path | None = None  # the submission's folder, measured against the disk limit
    lock: int | None = None  # as the separate user: the machine-wide lock held while this subject lives
    uid: int | None = None  # ... and that user, every process of which is this submission's
    cgroup: Cgroup | None = None  # unprotected: the subject's own cgroup, where one can be made here
    memory_before: cgroups.Memory | None = None  # the grading's memory cgroup at the start (its OOM kills since count)
    peak_used: int = 0  # the most the submission was measured using (as ``check`` decides: RSS, or PSS over the limit)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        """Unprotected, the subject goes into a cgroup of its own where this machine lets us make one, so that
        ``kill`` ends everything it started at once (``Cgroup``); elsewhere ``kill`` loops over what it finds.
        Nothing of the submission runs before this (its cells come after ``start`` returns)."""
        if self.memory_before is None:
            self.memory_before = cgroups.memory()
        if self.mode == "unprotected" and self.cgroup is None:
            self.cgroup = Cgroup.make(f"dtlabs-subject-{os.getpid()}-{self.popen.pid}")
            if self.cgroup is not None and not self.cgroup.add(self.popen.pid):
                self.cgroup.remove()
                self.cgroup = None

    def members(self) -> list:
        return self._tree()

    def _tree(self) -> list:
        """The submission's processes: the box's tree, and outside bubblewrap every other descendant of this process
        (the orphans it adopted as a subreaper, those that ended reaped first), but this process's own warm servers and
        what they forked."""
        if self.mode == "bwrap":
            return processes.tree(self.popen.pid)
        reap_adopted(keep=(self.popen.pid,))  # first: a scan while hoppers fork would otherwise pile up their zombies
        found = processes.tree(self.popen.pid, include_orphans=True)
        from lab_utils import warm

        ours = warm.own_processes()
        return [p for p in found if p.pid not in ours]

    def _watch(self) -> None:
        polls = 0
        while not self._stop.wait(self.limits.poll_s):  # (each check's members() reaps the adopted orphans first)
            if self.popen.poll() is not None:
                return
            polls += 1
            if self.check(disk=polls % self.limits.disk_every == 0):
                return

    def check(self, disk: bool = True) -> bool:
        """Measure the submission against its limits once (``disk``: its folder and the OOM counters too); over one,
        stop it and keep the reason. True if it was stopped. The watchdog calls it every ``poll_s``; the grader once
        more at the end, so a flood that a loaded machine's watchdog had not yet seen is named as well."""
        import psutil

        if disk and self.workdir is not None:
            used = folder_bytes(self.workdir, stop_at=self.limits.disk_mb << 20)
            if used > self.limits.disk_mb << 20:
                self.kill(f"disk limit: the submission wrote more than {self.limits.disk_mb} MB")
                return True
        procs = self.members()
        if len(procs) > self.limits.max_procs:
            self.kill(f"process limit: the submission started more than {self.limits.max_procs} processes")
            return True
        grown = 0
        if self.caller_baseline is not None:  # the grader holding what the submission sent it
            grown = max(0, psutil.Process().memory_info().rss - self.caller_baseline)
        limit = self.limits.memory_mb << 20
        # RSS first (cheap); a sum of RSS counts each shared page (libtorch, a framework's shared memory) once per
        # process that maps it, so over the limit the decision is taken on PSS, where shared pages count once
        used = _memory(procs, "rss") + grown
        if used > limit:
            used = _memory(procs, "pss") + grown
        self.peak_used = max(self.peak_used, used)
        if used > limit:
            # how far over is the submission's to choose (a grade line can reach the student): only the limit
            self.kill(f"memory limit: the submission's processes used more than {self.limits.memory_mb} MB")
            return True
        oom = self.oom_reason() if disk else None  # as seldom as the disk (a few ms of cgroup files a look)
        if oom:  # a process of the grading (a rank, the subject) ended by the kernel: the grade cannot stand as is
            self.kill(oom)
            return True
        return False

    def oom_reason(self) -> str | None:
        """Why the submission stopped, where the out-of-memory killer killed in the grading's memory cgroup since
        the box started (its own counters: v2 memory.events, v1 memory.oom_control and failcnt); None otherwise.
        The student's reason only where the submission caused it: it was measured past its own limit
        (``memory_mb``), or the cgroup had that much free when it started, so reaching the cgroup's limit took more
        than its allowance. Else the machine's: the cgroup's limit was reached with the submission within its
        allowance (too many at once, or a limit below ``memory_mb``), and it is graded again, not given a zero."""
        before = self.memory_before
        if before is None or before.folder is None:
            return None
        after = cgroups.memory()
        if after.folder != before.folder or not cgroups.oom_killed(before, after):
            return None
        allowance = self.limits.memory_mb
        if self.peak_used > allowance << 20 or (before.free is not None and before.free >= allowance << 20):
            return (f"memory limit: the submission's processes used more than {allowance} MB (the out-of-memory "
                    "killer stopped them)")
        peak = f", its peak use {cgroups.mb(after.peak)}" if after.peak else ""
        where = (f"the grading machine's memory limit of {cgroups.mb(after.limit)} ({after.source}{peak}), which had "
                 f"{cgroups.mb(before.free)} free when it started, less than" if after.limit is not None else
                 f"the machine's memory ({after.source}{peak}), the submission measured within")
        return (f"{outcomes.ENVIRONMENT_MARK}the out-of-memory killer stopped the submission at {where} its own "
                f"limit of {allowance} MB: grade fewer submissions at once (--jobs), lower c.DTLabs.memory_mb, or give "
                "the grading more memory")

    def rebase_caller(self) -> None:
        """Count the starting process's growth from now (after its own start-up imports)."""
        if self.caller_baseline is not None:
            import psutil

            self.caller_baseline = psutil.Process().memory_info().rss

    def kill(self, reason: str | None = None) -> None:
        """Stop the submission, every process it started included: under bubblewrap its pid namespace ends with it;
        elsewhere a process that forks and exits every few milliseconds outlives a kill from one snapshot, so its
        cgroup is killed whole, the separate user's processes are killed as that user until none runs
        (``separate_user.kill_user``), and what is still found below this process is killed until none is left.
        Raises RuntimeError with the reason where something still runs after seconds of that."""
        if reason and not self.reason:
            self.reason = reason
        if self.mode == "bwrap":
            processes.kill_tree(self.popen.pid)
        else:
            if self.cgroup is not None:
                self.cgroup.kill()
            if self.lock is not None:  # whatever of the separate user runs is this submission's
                separate_user.kill_user(self.uid)
            processes.kill_until_none(self._tree, "the submission's processes")
        try:
            self.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass

    def close(self) -> None:
        """The end of the submission: nothing of it runs after this, and as the separate user nothing it left in a
        world-writable folder stays for the next (``separate_user.end_user``; the next subject's start does it again
        and refuses to start where it cannot)."""
        self._stop.set()
        try:
            self.kill()
            if self.lock is not None:
                separate_user.end_user(self.uid)
        finally:
            if self.mode != "bwrap":
                reap_adopted(keep=(self.popen.pid,))
            if self.cgroup is not None:
                self.cgroup.remove()
            if self.lock is not None:
                os.close(self.lock)
                self.lock = None
