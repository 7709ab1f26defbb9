"""What one submission may use, and the watchdog that holds it to that in every mode: the total RSS of its
processes, their number and its folder's size, with the reason it stopped a box, so a grade can say "memory limit"
instead of "dead kernel"."""
from __future__ import annotations

import os
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

from lab_utils import processes, settings
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


def limit_resources(memory_mb: int) -> None:  # runs in the child between fork and exec
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    cap = memory_mb * 4 << 20  # address space per process: generous (torch reserves far more than it touches)
    try:
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    except (ValueError, OSError):
        pass


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
    _stop: threading.Event = field(default_factory=threading.Event)

    def members(self) -> list:
        return processes.tree(self.popen.pid, include_orphans=self.mode != "bwrap")

    def _watch(self) -> None:
        polls = 0
        while not self._stop.wait(self.limits.poll_s):
            if self.popen.poll() is not None:
                return
            polls += 1
            if self.check(disk=polls % self.limits.disk_every == 0):
                return

    def check(self, disk: bool = True) -> bool:
        """Measure the submission against its limits once (``disk``: its folder too); over one, stop it and keep the
        reason. True if it was stopped. The watchdog calls it every ``poll_s``; the grader once more at the end, so
        a flood that a loaded machine's watchdog had not yet seen is named as well."""
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
        if _memory(procs, "rss") + grown > limit:
            used = _memory(procs, "pss") + grown
            if used > limit:
                # how far over is the submission's to choose (a grade line can reach the student): only the limit
                self.kill(f"memory limit: the submission's processes used more than {self.limits.memory_mb} MB")
                return True
        return False

    def rebase_caller(self) -> None:
        """Count the starting process's growth from now (after its own start-up imports)."""
        if self.caller_baseline is not None:
            import psutil

            self.caller_baseline = psutil.Process().memory_info().rss

    def kill(self, reason: str | None = None) -> None:
        if reason and not self.reason:
            self.reason = reason
        processes.kill_tree(self.popen.pid, include_orphans=self.mode != "bwrap")
        try:
            self.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass

    def close(self) -> None:
        self._stop.set()
        self.kill()
        if self.lock is not None:  # whatever of the separate user still runs is this submission's: it goes first
            separate_user.kill_user(self.uid)
            os.close(self.lock)
            self.lock = None
