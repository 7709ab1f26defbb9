"""The CPU budget: how many CPUs work may be sized to (threads per rank, torchrun's OMP_NUM_THREADS, grading's
--jobs), the smallest of the cgroup CPU quota of the process's own cgroup and its ancestors, its cpuset and its
affinity mask, rounded down, at least 1, with where it came from in words."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

from lab_utils.cgroups.tree import _chain, _read

BUDGET_ENV = "DTLABS_CPUS"  # a budget handed down to a process that cannot read its cgroup (the sandboxed subject)


@dataclass(frozen=True)
class CpuBudget:
    """How many CPUs work may be sized to (at least 1), and where that number came from, in words."""

    cpus: int
    source: str


def parse_cpu_max(text: str) -> float | None:
    """CPUs of a v2 ``cpu.max`` ("max 100000" -> None, "150000 100000" -> 1.5)."""
    parts = (text or "").split()
    if not parts or parts[0] == "max":
        return None
    try:
        quota, period = int(parts[0]), int(parts[1]) if len(parts) > 1 else 100000
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def parse_cfs(quota: str | None, period: str | None) -> float | None:
    """CPUs of v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (-1 = none)."""
    try:
        q, p = int((quota or "").strip()), int((period or "").strip())
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None


def parse_cpuset(text: str | None) -> int | None:
    """How many CPUs a cpuset list names ("0-3,6" -> 5); None for an empty or unreadable one."""
    n = 0
    for part in (text or "").strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        try:
            n += int(hi or lo) - int(lo) + 1
        except ValueError:
            return None
    return n or None


def cpu_quota(pid="self", proc: str = "/proc", root: str = "/") -> tuple[float, str] | None:
    """The smallest CPU quota on ``pid``'s cgroup and its ancestors, in CPUs, with the file that sets it."""
    best = None
    for version, folder in _chain("cpu", pid, proc, root):
        if version == 2:
            cpus, where = parse_cpu_max(_read(os.path.join(folder, "cpu.max"))), os.path.join(folder, "cpu.max")
        else:
            where = os.path.join(folder, "cpu.cfs_quota_us")
            cpus = parse_cfs(_read(where), _read(os.path.join(folder, "cpu.cfs_period_us")))
        if cpus is not None and (best is None or cpus < best[0]):
            best = (cpus, where)
    return best


def cpuset(pid="self", proc: str = "/proc", root: str = "/") -> tuple[int, str] | None:
    """How many CPUs ``pid``'s cpuset allows (the effective set, which already holds the ancestors'), with its file."""
    for version, folder in _chain("cpuset", pid, proc, root):
        names = ("cpuset.cpus.effective",) if version == 2 else ("cpuset.effective_cpus", "cpuset.cpus")
        for name in names:
            n = parse_cpuset(_read(os.path.join(folder, name)))
            if n is not None:
                return n, os.path.join(folder, name)
    return None


def affinity(pid="self") -> int | None:
    if not hasattr(os, "sched_getaffinity"):
        return None
    try:
        return len(os.sched_getaffinity(0 if pid == "self" else int(pid)))
    except OSError:
        return None


def cpu_budget(pid="self", proc: str = "/proc", root: str = "/", affinity_cpus: int | None = -1,
               env: dict | None = None) -> CpuBudget:
    """The CPUs work may be sized to: the smallest of the cgroup CPU quota (own and ancestors'), the cpuset and the
    affinity mask, rounded down, at least 1 (1.5 CPUs of quota -> 1); and of ``BUDGET_ENV`` in ``env`` (default
    os.environ), the budget a grader hands its sandboxed subject, which may not see /sys/fs/cgroup.
    ``affinity_cpus`` stands in for the mask in tests (-1: read it; None: none)."""
    found = []  # (cpus, words)
    handed = (os.environ if env is None else env).get(BUDGET_ENV, "")
    if handed.isdigit() and int(handed) > 0:
        found.append((int(handed), f"{BUDGET_ENV}={handed} (the budget of the process that started this one)"))
    quota = cpu_quota(pid, proc, root)
    if quota is not None:
        found.append((quota[0], f"cgroup CPU quota of {quota[0]:g} CPUs ({quota[1]})"))
    cs = cpuset(pid, proc, root)
    if cs is not None:
        found.append((cs[0], f"cpuset of {cs[0]} CPUs ({cs[1]})"))
    mask = affinity(pid) if affinity_cpus == -1 else affinity_cpus
    if mask is not None:
        found.append((mask, f"affinity mask of {mask} CPUs"))
    if not found:
        n = os.cpu_count() or 1
        return CpuBudget(n, f"{n} CPUs counted by os.cpu_count() (no cgroup, cpuset or affinity mask found)")
    cpus, words = min(found, key=lambda f: f[0])
    others = [w for c, w in found if w != words]
    if quota is None:
        others.append("no cgroup CPU quota")
    source = words + (f"; also {', '.join(others)}" if others else "")
    return CpuBudget(max(1, math.floor(cpus)), source)
