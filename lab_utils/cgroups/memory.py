"""Memory: a cgroup's limit (the smallest over its ancestors), its use and the out-of-memory killer's counters
(v2 memory.events oom_kill; v1 memory.oom_control oom_kill and memory.failcnt), and the words for a process the
killer ended (which, the limit, the use, what to change) and for work that cannot start in what is left."""
from __future__ import annotations

import os
from dataclasses import dataclass

from lab_utils.cgroups.tree import _chain, _field, _int, _read

UNLIMITED_V1 = 1 << 62  # v1 writes "no limit" as PAGE_COUNTER_MAX pages (9223372036854771712 here)


@dataclass(frozen=True)
class Memory:
    """A cgroup's memory: its limit in bytes (None: none on it or an ancestor), what it uses, how many processes the
    out-of-memory killer has killed in it (compare before and after), and which folder that is, in words."""

    limit: int | None
    usage: int
    oom_kills: int
    source: str
    failcnt: int = 0  # v1: how often the limit was hit (allocations refused or reclaimed), 0 on v2
    folder: str | None = None  # the cgroup folder these numbers are of
    peak: int | None = None  # the most it used (v1 memory.max_usage_in_bytes, v2 memory.peak where the kernel has it)
    reclaimable: int = 0  # of ``usage``, the file cache the kernel drops before it kills (inactive_file)

    @property
    def free(self) -> int | None:
        """What can still be allocated before the limit: the limit less the use, file cache not counted."""
        return None if self.limit is None else max(0, self.limit - self.usage + self.reclaimable)


def folder_limit(version: int, folder: str) -> int | None:
    """The memory limit set on one cgroup folder itself (None: none, "max", v1's huge number, no file)."""
    if version == 2:
        text = (_read(os.path.join(folder, "memory.max")) or "").strip()
        return None if text in ("", "max") else _int(text)
    value = _int(_read(os.path.join(folder, "memory.limit_in_bytes")))
    return None if value is None or value >= UNLIMITED_V1 else value


def folder_memory(version: int, folder: str, limit: int | None = -1) -> Memory:
    """One folder's memory numbers (``limit`` -1: that folder's own limit)."""
    if version == 2:
        usage = _int(_read(os.path.join(folder, "memory.current"))) or 0
        kills = _field(_read(os.path.join(folder, "memory.events")), "oom_kill") or 0
        failcnt, peak = 0, _int(_read(os.path.join(folder, "memory.peak")))
    else:
        usage = _int(_read(os.path.join(folder, "memory.usage_in_bytes"))) or 0
        kills = _field(_read(os.path.join(folder, "memory.oom_control")), "oom_kill") or 0
        failcnt = _int(_read(os.path.join(folder, "memory.failcnt"))) or 0
        peak = _int(_read(os.path.join(folder, "memory.max_usage_in_bytes")))
    limit = folder_limit(version, folder) if limit == -1 else limit
    stat = _read(os.path.join(folder, "memory.stat"))
    cache = (_field(stat, "inactive_file") if version == 2 else _field(stat, "total_inactive_file")) or 0
    return Memory(limit, usage, kills, f"cgroup v{version} {folder}", failcnt, folder, peak, min(cache, usage))


def memory(pid="self", proc: str = "/proc", root: str = "/") -> Memory:
    """``pid``'s memory limit (the smallest on its cgroup and ancestors), the use of the cgroup that sets it (of its
    own where none does), and the OOM kills counted from its own cgroup up to that one (v1 counts a kill in the
    cgroup whose limit was hit; v2's memory.events counts its descendants' too, so the limiting one's alone)."""
    chain = [(v, f) for v, f in _chain("memory", pid, proc, root)
             if os.path.exists(os.path.join(f, "memory.max" if v == 2 else "memory.limit_in_bytes"))
             or os.path.exists(os.path.join(f, "memory.current" if v == 2 else "memory.usage_in_bytes"))]
    if not chain:
        return Memory(None, 0, 0, "no memory cgroup found")
    best = None  # index in chain of the smallest limit
    for i, (version, folder) in enumerate(chain):
        lim = folder_limit(version, folder)
        if lim is not None and (best is None or lim < folder_limit(*chain[best])):
            best = i
    at = best if best is not None else 0
    version, folder = chain[at]
    top = folder_memory(version, folder)
    if version == 2:
        kills, failcnt = top.oom_kills, 0
    else:
        below = [folder_memory(v, f) for v, f in chain[:at + 1] if v == 1]
        kills, failcnt = sum(m.oom_kills for m in below), sum(m.failcnt for m in below)
    words = (f"limit set on cgroup v{version} {folder}" if best is not None
             else f"no limit on cgroup v{version} {folder} or its ancestors")
    return Memory(top.limit, top.usage, kills, words, failcnt, folder, top.peak, top.reclaimable)


def mb(n: int | None) -> str:
    return "none" if n is None else f"{n / (1 << 20):.0f} MB"


def oom_killed(before: Memory, after: Memory) -> int:
    """How many processes the out-of-memory killer killed between two readings of one cgroup (a kernel without
    v1's oom_kill line: 1 if the limit was hit meanwhile, failcnt, with the use near it)."""
    if after.oom_kills > before.oom_kills:
        return after.oom_kills - before.oom_kills
    near = after.limit is not None and max(after.peak or 0, after.usage) >= after.limit * 0.9
    return 1 if after.failcnt > before.failcnt and near and not after.oom_kills else 0


def oom_explanation(before: Memory, after: Memory, who: str, fix: str) -> str | None:
    """Words for ``who`` ("rank 0 was") killed by the out-of-memory killer, if the cgroup's counters moved between
    ``before`` and ``after``; None if they did not. ``fix``: what to change."""
    if not oom_killed(before, after):
        return None
    use = f"; its peak use was {mb(after.peak)}" if after.peak else f"; {mb(after.usage)} in use after the kill"
    return (f"{who} killed by the out-of-memory killer: the memory limit of {mb(after.limit)} was reached "
            f"({after.source}{use}). {fix}").rstrip()


def oom_words(killed: list[str], before: Memory, fix: str, after: Memory | None = None) -> str | None:
    """Why the processes ``killed`` (their names, "rank 0": those that died by SIGKILL) died, where the memory
    cgroup counted out-of-memory kills since ``before`` (a reading of it taken before they started; ``after``: now);
    None otherwise. For ranks (``launcher.diagnostics``), torchrun workers and anything else sized to a cgroup."""
    if not killed or before.folder is None:
        return None
    after = after or memory()
    if after.folder != before.folder:
        return None
    n = oom_killed(before, after)
    if not n:
        return None
    named = killed[:n]
    who = (f"{named[0]} was" if len(named) == 1 else
           ", ".join(named[:-1]) + f" and {named[-1]} were")
    return oom_explanation(before, after, who, fix)


def shortfall(what: str, count: int, each: int, mem: Memory, fix: str) -> str | None:
    """Words for ``count`` processes (``what``: "rank(s)") of ``each`` bytes that do not fit in what the memory
    cgroup has free, to say before any starts (one that cannot is killed, or stalls); None where they fit."""
    need = count * each
    if mem.free is None or mem.free >= need:
        return None
    return (f"not enough memory to start {count} {what}: each needs about {mb(each)} to start, {mb(need)} in all, and "
            f"only {mb(mem.free)} of the memory limit of {mb(mem.limit)} is free ({mb(mem.usage - mem.reclaimable)} "
            f"in use; {mem.source}). {fix}")
