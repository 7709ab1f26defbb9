"""Child cgroups made under this process's own, with a CPU quota and a memory limit: what the tests and the class
benchmark run work in, to see it sized to the limits and named when it overruns them."""
from __future__ import annotations

import os
import signal
import time

from lab_utils.cgroups.memory import Memory, folder_memory
from lab_utils.cgroups.tree import V2, _field, _int, _read, _write, folders


class Child:
    """A cgroup made under this process's own, with an optional CPU quota and memory limit: on cgroup v2 where its
    parent enables the controllers it needs (cgroup.subtree_control), else in the v1 ``cpu`` and ``memory``
    hierarchies. What is moved in, and everything it then starts, stays in it. ``make`` returns None where none can be
    made here (no write access, no such controller, a read-only cgroupfs)."""

    def __init__(self, version: int = 1, v1: dict | None = None, v2: str | None = None):
        self.version = version
        self.v1 = dict(v1 or {})  # controller -> folder (v1)
        self.v2 = v2  # folder (v2)

    @property
    def paths(self) -> list[str]:
        return [self.v2] if self.v2 else list(dict.fromkeys(self.v1.values()))

    @classmethod
    def make(cls, name: str, cpus: float | None = None, memory_bytes: int | None = None) -> "Child | None":
        return cls._make_v2(name, cpus, memory_bytes) or cls._make_v1(name, cpus, memory_bytes)

    @classmethod
    def _make_v2(cls, name, cpus, memory_bytes) -> "Child | None":
        own = folders(V2)
        if not own:
            return None
        parent = own[0]
        enabled = set((_read(os.path.join(parent, "cgroup.subtree_control")) or "").split())
        needed = {c for c, want in (("cpu", cpus), ("memory", memory_bytes)) if want is not None}
        # a controller of a v1 hierarchy is counted there: a hybrid layout's empty cgroup2 tree would count nothing
        needed |= {c for c in ("cpu", "memory") if folders(c)}
        if not needed <= enabled:
            return None
        path = os.path.join(parent, name)
        try:
            os.mkdir(path)
        except OSError:
            return None
        child = cls(version=2, v2=path)
        try:
            if cpus is not None:
                _write(os.path.join(path, "cpu.max"), f"{max(1000, int(cpus * 100000))} 100000")
            if memory_bytes is not None:
                _write(os.path.join(path, "memory.max"), str(int(memory_bytes)))
                if os.path.exists(os.path.join(path, "memory.swap.max")):
                    _write(os.path.join(path, "memory.swap.max"), "0")
        except OSError:
            child.remove()
            return None
        return child

    @classmethod
    def _make_v1(cls, name, cpus, memory_bytes) -> "Child | None":
        child = cls(version=1)
        made = child.v1
        for controller, want in (("cpu", cpus), ("memory", memory_bytes)):
            own = folders(controller)
            path = os.path.join(own[0], name) if own else None
            try:
                if path is None:
                    raise OSError(f"no v1 {controller} hierarchy")
                os.mkdir(path)
                made[controller] = path
                if controller == "cpu" and cpus is not None:
                    period = _int(_read(os.path.join(path, "cpu.cfs_period_us"))) or 100000
                    _write(os.path.join(path, "cpu.cfs_quota_us"), str(max(1000, int(cpus * period))))
                if controller == "memory" and memory_bytes is not None:
                    _write(os.path.join(path, "memory.limit_in_bytes"), str(int(memory_bytes)))
            except OSError:
                if want is not None:  # a limit asked for and not set: no child at all
                    child.remove()
                    return None
        return child if made else None

    def add(self, pid: int) -> bool:
        """Move ``pid`` in (every hierarchy of this child); False where one refused."""
        ok = True
        for path in self.paths:
            try:
                _write(os.path.join(path, "cgroup.procs"), str(pid))
            except OSError:
                ok = False
        return ok

    def pids(self) -> list[int]:
        found = set()
        for path in self.paths:
            for word in (_read(os.path.join(path, "cgroup.procs")) or "").split():
                if word.isdigit():
                    found.add(int(word))
        return sorted(found)

    def _memory_folder(self) -> tuple[int, str] | None:
        if self.v2:
            return 2, self.v2
        return (1, self.v1["memory"]) if "memory" in self.v1 else None

    def memory(self) -> Memory:
        at = self._memory_folder()
        return folder_memory(*at) if at else Memory(None, 0, 0, "no memory cgroup")

    def oom_kills(self) -> int:
        return self.memory().oom_kills

    def throttled(self) -> int:
        """How many CPU periods this child was throttled in (cpu.stat nr_throttled): its quota bit."""
        path = self.v2 or self.v1.get("cpu")
        return (_field(_read(os.path.join(path, "cpu.stat")), "nr_throttled") or 0) if path else 0

    def kill(self, deadline_s: float = 10.0) -> None:
        """SIGKILL everything in it until it holds no process (cgroup.kill where v2 has it; else each pid, again
        and again, so one forking meanwhile is caught); RuntimeError after ``deadline_s``."""
        end = time.monotonic() + deadline_s
        while self.pids():
            if self.v2 and os.path.exists(os.path.join(self.v2, "cgroup.kill")):
                try:
                    _write(os.path.join(self.v2, "cgroup.kill"), "1")
                except OSError:
                    pass
            else:
                for pid in self.pids():
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
            if time.monotonic() > end:
                raise RuntimeError(f"processes still ran in {self.paths} after {deadline_s:g} s: {self.pids()[:5]}")
            time.sleep(0.01)

    def remove(self) -> bool:
        """Remove its folders (a cgroup with processes cannot be: ``kill`` first); True if all are gone."""
        ok = True
        for path in self.paths:
            for _ in range(50):  # a killed process leaves its cgroup a moment after it is reaped
                try:
                    os.rmdir(path)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.02)
            ok = ok and not os.path.isdir(path)
        return ok

    def __repr__(self) -> str:
        return f"Child(v{self.version}, {self.paths})"
