"""lab_utils.cgroups on fake /proc and /sys trees: cgroup v1, v2 and the hybrid layout of the course's machines, a
limit on an ancestor, "max", fractional quotas, missing files; and the OOM explanation's words. Real cgroups:
tests/launcher/test_cpu_budget.py."""
from __future__ import annotations

import os

import pytest

from lab_utils import cgroups
from lab_utils.cgroups import Memory

HYBRID_MOUNTS = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
HYBRID_CGROUP = "9:name=systemd:/\n4:memory:/process_api/abc\n3:cpuset:/\n1:cpu:/job/step\n0::/\n"
V2_MOUNTS = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
V1_COMBINED = "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n" \
              "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"


def tree(tmp_path, cgroup: str, mountinfo: str, files: dict) -> dict:
    """A fake /proc/self and cgroup tree under ``tmp_path``; returns the keywords the readers take."""
    proc = tmp_path / "proc" / "self"
    proc.mkdir(parents=True)
    (proc / "cgroup").write_text(cgroup)
    (proc / "mountinfo").write_text(mountinfo)
    for rel, text in files.items():
        path = tmp_path / rel.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        if text is not None:
            path.write_text(text)
    return {"proc": str(tmp_path / "proc"), "root": str(tmp_path)}


def test_parsers_read_the_kernel_formats():
    assert cgroups.parse_cpu_max("max 100000\n") is None
    assert cgroups.parse_cpu_max("150000 100000\n") == 1.5
    assert cgroups.parse_cfs("-1\n", "100000\n") is None
    assert cgroups.parse_cfs("50000", "100000") == 0.5
    assert cgroups.parse_cfs(None, "100000") is None  # a missing file
    assert cgroups.parse_cpuset("0-3,6\n") == 5 and cgroups.parse_cpuset("\n") is None
    assert cgroups.parse_cgroup("2:cpu,cpuacct:/a\n0::/b\n") == {"cpu": "/a", "cpuacct": "/a", "": "/b"}
    (mount,) = cgroups.parse_mountinfo(r"1 2 0:3 /x /sys/fs/cgroup/my\040dir rw - cgroup cgroup rw,memory" "\n")
    assert mount.point == "/sys/fs/cgroup/my dir" and mount.root == "/x" and "memory" in mount.controllers


def test_hybrid_v1_quota_on_an_ancestor_binds_and_a_fraction_rounds_down(tmp_path):
    """The course's machines: v1 controllers plus a controller-less cgroup2 mount. A quota of 1.5 CPUs on the
    parent of the process's own cpu cgroup (none on its own) gives a budget of 1."""
    kw = tree(tmp_path, HYBRID_CGROUP, HYBRID_MOUNTS, {
        "sys/fs/cgroup/cpu/cpu.cfs_quota_us": "-1\n", "sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000\n",
        "sys/fs/cgroup/cpu/job/cpu.cfs_quota_us": "150000\n", "sys/fs/cgroup/cpu/job/cpu.cfs_period_us": "100000\n",
        "sys/fs/cgroup/cpu/job/step/cpu.cfs_quota_us": "-1\n",
        "sys/fs/cgroup/cpu/job/step/cpu.cfs_period_us": "100000\n",
        "sys/fs/cgroup/cpuset/cpuset.effective_cpus": "0-3\n",
        "sys/fs/cgroup/unified/cgroup.controllers": "\n",
    })
    assert cgroups.folders("cpu", **kw)[0].endswith("sys/fs/cgroup/cpu/job/step")
    budget = cgroups.cpu_budget(**kw, affinity_cpus=4, env={})
    assert budget.cpus == 1, budget
    assert "1.5 CPUs" in budget.source and "cpu/job/cpu.cfs_quota_us" in budget.source


def test_v2_cpu_max_cpuset_and_affinity_the_smallest_wins(tmp_path):
    kw = tree(tmp_path, "0::/user.slice/u/session\n", V2_MOUNTS, {
        "sys/fs/cgroup/cpu.max": None,  # the root has none
        "sys/fs/cgroup/user.slice/cpu.max": "max 100000\n",
        "sys/fs/cgroup/user.slice/u/cpu.max": "350000 100000\n",
        "sys/fs/cgroup/user.slice/u/session/cpu.max": "max 100000\n",
        "sys/fs/cgroup/user.slice/u/session/cpuset.cpus.effective": "0-7\n",
    })
    assert cgroups.cpu_budget(**kw, affinity_cpus=16, env={}).cpus == 3  # 3.5 CPUs of quota
    budget = cgroups.cpu_budget(**kw, affinity_cpus=2, env={})
    assert budget.cpus == 2 and budget.source.startswith("affinity mask of 2 CPUs"), budget
    kw2 = tree(tmp_path / "b", "0::/a\n", V2_MOUNTS, {"sys/fs/cgroup/a/cpuset.cpus.effective": "2,5\n",
                                                      "sys/fs/cgroup/a/cpu.max": "max 100000\n"})
    budget = cgroups.cpu_budget(**kw2, affinity_cpus=8, env={})
    assert budget.cpus == 2 and budget.source.startswith("cpuset of 2 CPUs") and "no cgroup CPU quota" in budget.source


def test_a_tiny_quota_still_gives_one_cpu_and_a_handed_budget_caps(tmp_path):
    kw = tree(tmp_path, "1:cpu,cpuacct:/x\n", V1_COMBINED, {
        "sys/fs/cgroup/cpu,cpuacct/x/cpu.cfs_quota_us": "20000\n",
        "sys/fs/cgroup/cpu,cpuacct/x/cpu.cfs_period_us": "100000\n",
    })
    assert cgroups.cpu_budget(**kw, affinity_cpus=4, env={}).cpus == 1  # 0.2 CPUs: at least 1
    kw = tree(tmp_path / "b", "1:cpu,cpuacct:/\n", V1_COMBINED, {})
    budget = cgroups.cpu_budget(**kw, affinity_cpus=4, env={cgroups.BUDGET_ENV: "3"})
    assert budget.cpus == 3 and cgroups.BUDGET_ENV in budget.source


def test_missing_files_and_no_cgroup_at_all(tmp_path):
    kw = tree(tmp_path, HYBRID_CGROUP, HYBRID_MOUNTS, {"sys/fs/cgroup/cpu/job/step/tasks": ""})  # no cpu files
    assert cgroups.cpu_quota(**kw) is None and cgroups.cpuset(**kw) is None
    assert cgroups.cpu_budget(**kw, affinity_cpus=3, env={}).cpus == 3
    mem = cgroups.memory(**kw)
    assert mem.limit is None and mem.oom_kills == 0
    none = {"proc": str(tmp_path / "nowhere"), "root": str(tmp_path)}
    assert cgroups.folders("cpu", **none) == []
    assert cgroups.cpu_budget(**none, affinity_cpus=None, env={}).cpus == (os.cpu_count() or 1)
    assert cgroups.memory(**none).source == "no memory cgroup found"


def test_v1_memory_the_smallest_limit_over_ancestors_unlimited_is_none_and_counters_add(tmp_path):
    base = "sys/fs/cgroup/memory"
    kw = tree(tmp_path, HYBRID_CGROUP, HYBRID_MOUNTS, {
        f"{base}/memory.limit_in_bytes": "9223372036854771712\n",
        f"{base}/process_api/memory.limit_in_bytes": str(800 << 20),
        f"{base}/process_api/memory.usage_in_bytes": str(700 << 20),
        f"{base}/process_api/memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n",
        f"{base}/process_api/memory.failcnt": "5\n",
        f"{base}/process_api/abc/memory.limit_in_bytes": "9223372036854771712\n",
        f"{base}/process_api/abc/memory.usage_in_bytes": str(100 << 20),
        f"{base}/process_api/abc/memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
        f"{base}/process_api/abc/memory.failcnt": "7\n",
    })
    mem = cgroups.memory(**kw)
    assert mem.limit == 800 << 20 and mem.usage == 700 << 20  # the limiting cgroup's use
    assert mem.oom_kills == 3 and mem.failcnt == 12 and mem.free == 100 << 20
    assert "process_api" in mem.source and not mem.source.endswith("abc")
    unlimited = tree(tmp_path / "u", "4:memory:/\n", HYBRID_MOUNTS,
                     {f"{base}/memory.limit_in_bytes": "9223372036854771712"})
    assert cgroups.memory(**unlimited).limit is None


def test_v2_memory_max_and_events(tmp_path):
    kw = tree(tmp_path, "0::/a/b\n", V2_MOUNTS, {
        "sys/fs/cgroup/a/memory.max": str(1 << 30), "sys/fs/cgroup/a/memory.current": str(600 << 20),
        "sys/fs/cgroup/a/memory.events": "low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\n",
        "sys/fs/cgroup/a/b/memory.max": "max\n", "sys/fs/cgroup/a/b/memory.current": str(10 << 20),
        "sys/fs/cgroup/a/b/memory.events": "oom_kill 1\n",
    })
    mem = cgroups.memory(**kw)
    assert (mem.limit, mem.usage, mem.oom_kills) == (1 << 30, 600 << 20, 1), mem  # hierarchical: the limiting one's


def test_oom_explanation_names_the_limit_only_when_the_counters_moved():
    before = Memory(800 << 20, 100 << 20, 0, "cgroup v1 /x", 0)
    assert cgroups.oom_explanation(before, before, "rank 0 was", "fix") is None
    after = Memory(800 << 20, 10 << 20, 1, "cgroup v1 /x", 3, peak=800 << 20)
    words = cgroups.oom_explanation(before, after, "rank 0 was", "Use fewer ranks.")
    assert words.startswith("rank 0 was killed by the out-of-memory killer") and "limit of 800 MB" in words
    assert "peak use was 800 MB" in words and words.endswith("Use fewer ranks.")
    hit = Memory(800 << 20, 790 << 20, 0, "cgroup v1 /x", 3)  # a kernel without the oom_kill line
    assert "800 MB" in cgroups.oom_explanation(before, hit, "rank 1 was", "")
    far = Memory(800 << 20, 100 << 20, 0, "cgroup v1 /x", 3, peak=200 << 20)  # hit once, long ago: not this kill
    assert cgroups.oom_explanation(before, far, "rank 1 was", "") is None
