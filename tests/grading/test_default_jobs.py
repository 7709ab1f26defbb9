"""``dtlabs grade`` without ``--jobs``: as many submissions at once as the CPU budget holds at 2 CPUs each, and no
more than the memory cgroup's limit holds at ``c.DTLabs.memory_mb`` each (lab_utils.cgroups)."""
from __future__ import annotations

from types import SimpleNamespace

from lab_utils import cgroups
from lab_utils.grading import batch


def _jobs(monkeypatch, cpus: int, limit_mb: int | None, memory_mb: int = 2048):
    monkeypatch.setattr(cgroups, "cpu_budget", lambda: cgroups.CpuBudget(cpus, "a quota of the test"))
    monkeypatch.setattr(cgroups, "memory", lambda: cgroups.Memory(None if limit_mb is None else limit_mb << 20, 0, 0,
                                                                   "a cgroup of the test"))
    return batch.default_jobs(SimpleNamespace(memory_mb=memory_mb))


def test_the_cpu_budget_sizes_the_jobs(monkeypatch):
    assert _jobs(monkeypatch, 2, None)[0] == 1  # two cores (this machine): one at a time, as before
    jobs, why = _jobs(monkeypatch, 9, None)
    assert jobs == 4 and "9 CPUs (a quota of the test)" in why
    assert _jobs(monkeypatch, 1, None)[0] == 1


def test_the_memory_limit_caps_the_jobs(monkeypatch):
    jobs, why = _jobs(monkeypatch, 16, 5000, memory_mb=2048)
    assert jobs == 2 and "5000 MB" in why and "memory_mb=2048" in why
    assert _jobs(monkeypatch, 16, 1000, memory_mb=2048)[0] == 1  # at least one
