"""The CPU budget and the memory limit in real cgroups: a child of this test process's own cgroup (v2 where its
controllers are enabled, else the v1 ``cpu`` and ``memory`` hierarchies) with a CPU quota or a memory limit, a Python
process started in it, and the cgroup removed afterwards. Under a 1-CPU quota a rank runs 1 intra-op thread; ranks
that run out of the cgroup's memory are named with the limit; a launch that cannot fit says so before it starts.
Skipped, with the reason, where this process may not make such a cgroup (not root, no writable cgroupfs)."""
from __future__ import annotations

import json
import sys

import pytest

from helpers.cgroups import child_cgroup, run_in  # noqa: F401 - a fixture

pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"), reason="cgroups are Linux's"),
              pytest.mark.slow]  # each starts a Python that imports torch and launches ranks


def test_under_a_one_cpu_quota_the_budget_is_one_and_a_rank_runs_one_thread(child_cgroup):
    child = child_cgroup(cpus=1.0)
    run = run_in(child, """
        import json
        from lab_utils import cgroups, launch, shutdown

        def threads():
            import torch
            return torch.get_num_threads()

        budget = cgroups.cpu_budget()
        out = dict(cpus=budget.cpus, source=budget.source,
                   one=launch(threads, world_size=1, quiet=True), two=launch(threads, world_size=2, quiet=True))
        shutdown()
        print(json.dumps(out))
    """)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["cpus"] == 1 and "quota of 1 CPUs" in out["source"], out
    assert out["one"] == [1] and out["two"] == [1, 1], f"intra-op threads per rank under a 1-CPU quota: {out}"


OOM_SCRIPT = """
    from lab_utils import launch, shutdown, RankFailedError

    def hog():
        import time
        import torch
        keep = []
        for _ in range(40):  # 40 x 50 MB each, touched: far past the cgroup's limit
            keep.append(torch.ones(50 << 18))
            time.sleep(0.02)
        return len(keep)

    try:
        launch(hog, world_size=2, quiet=True, timeout=120)
        print("NO ERROR")
    except RankFailedError as exc:
        print("RANK", exc.rank)
        print(exc)
    shutdown()
"""


def test_ranks_killed_by_the_oom_killer_are_named_with_the_limit(child_cgroup):
    """Two ranks that overran an 800 MB cgroup ended in ``rank 0 was killed by SIGKILL``: now the error says the
    out-of-memory killer did it, names the rank, the limit and the use, and what to change."""
    limit = 800 << 20
    child = child_cgroup(memory_bytes=limit)
    run = run_in(child, OOM_SCRIPT)
    assert "NO ERROR" not in run.stdout, run.stdout
    mem = child.memory()
    if mem.oom_kills == 0 and mem.failcnt == 0:
        pytest.skip(f"this kernel's memory cgroup counted no OOM kill nor limit hit ({mem}): nothing to name")
    text = run.stdout
    assert "out-of-memory killer" in text and "memory limit of 800 MB" in text, text[-3000:]
    assert "RANK " in text and "rank " in text.split("RANK ", 1)[1], text[-3000:]
    assert "fewer ranks" in text and "peak use" in text, text[-3000:]


def test_a_launch_that_cannot_fit_in_the_memory_left_says_so_before_it_starts(child_cgroup):
    child = child_cgroup(memory_bytes=4 << 30)
    run = run_in(child, """
        import os
        from lab_utils import cgroups, launch, shutdown, LaunchError

        launch(abs, world_size=1, args=(1,), quiet=True)  # the zygote is up and counted
        mem = cgroups.memory()
        with open(os.path.join(mem.folder, "memory.limit_in_bytes" if mem.source.find(" v1 ") >= 0 else "memory.max"),
                  "w") as fh:
            fh.write(str(mem.usage - mem.reclaimable + (40 << 20)))  # 40 MB left: less than two ranks need
        try:
            launch(abs, world_size=2, args=(1,), quiet=True)
            print("STARTED")
        except LaunchError as exc:
            print(exc)
        shutdown()
    """)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "STARTED" not in run.stdout
    assert "not enough memory to start 2 rank(s)" in run.stdout and "fewer ranks" in run.stdout, run.stdout
