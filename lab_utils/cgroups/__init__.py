"""The limits this process runs in, read from its cgroups: one CPU budget (the cgroup's CPU quota, its cpuset and
the affinity mask) for everything that sizes work, the memory limit and use with the out-of-memory killer's counters,
and child cgroups made under this process's own (``Child``: the tests, the class benchmark).

Why one package, stdlib only: the zygote and every rank size their threads with it before torch is imported, and
every layer (launcher, torchrun, grading) reads the same numbers. Why the ancestors too: a quota or memory limit on a
parent cgroup (a Slurm job, a JupyterHub user slice) binds everything below it. Works on cgroup v1, v2 and the hybrid
layout (v1 controllers plus an empty cgroup2 mount, as on the course's machines); every reader takes the ``proc`` and
``root`` folders it reads from, so the parsing is tested on fake trees (tests/test_cgroups.py).

| module | its one job |
|---|---|
| tree.py   | where a process's cgroup folders are (/proc/PID/cgroup, mountinfo), own and ancestors, per controller |
| cpu.py    | the CPU budget (``cpu_budget``): quota, cpuset, affinity mask                                       |
| memory.py | the memory limit, use and OOM counters (``memory``), and the words for an OOM kill or a shortfall  |
| child.py  | child cgroups with a CPU quota or memory limit (``Child``)                                          |
"""
from lab_utils.cgroups.child import Child
from lab_utils.cgroups.cpu import (
    BUDGET_ENV, CpuBudget, affinity, cpu_budget, cpu_quota, cpuset, parse_cfs, parse_cpu_max, parse_cpuset,
)
from lab_utils.cgroups.memory import (
    UNLIMITED_V1, Memory, folder_limit, folder_memory, mb, memory, oom_explanation, oom_killed, oom_words, shortfall,
)
from lab_utils.cgroups.tree import V2, Mount, folders, parse_cgroup, parse_mountinfo

__all__ = [
    "BUDGET_ENV", "Child", "CpuBudget", "Memory", "Mount", "UNLIMITED_V1", "V2", "affinity", "cpu_budget",
    "cpu_quota", "cpuset", "folder_limit", "folder_memory", "folders", "mb", "memory", "oom_explanation",
    "oom_killed", "oom_words", "parse_cfs", "parse_cgroup", "parse_cpu_max", "parse_cpuset", "parse_mountinfo",
    "shortfall",
]
