"""Busy is not stuck: a rank kept off the CPU (a shared machine, a cgroup's quota) is not named stuck at the timeout,
while a rank waiting in a collective that its peer never calls still is (``diagnostics.Starvation``).

The parsing and the arithmetic run on a fake /proc; the real tests put processes in a child cgroup of this process's
own with a tiny CPU quota (0.05 CPU) and remove it afterwards, skipping with the reason where none can be made.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from lab_utils.launcher import diagnostics
from lab_utils.launcher.diagnostics import STARVED_EXTENSION_MAX, Starvation, run_delays


# ------------------------------------------------------------------------------------------ a fake /proc
def _set(proc, pid, delays_s: dict) -> None:
    """Threads of ``pid`` with the given run-queue delays (schedstat: run time ns, run delay ns, slices)."""
    for tid, delay in delays_s.items():
        d = proc / str(pid) / "task" / str(tid)
        d.mkdir(parents=True, exist_ok=True)
        (d / "schedstat").write_text(f"123456789 {int(delay * 1e9)} 42\n")


def test_run_delays_reads_every_thread_and_skips_what_it_cannot(tmp_path):
    _set(tmp_path, 7, {7: 1.5, 8: 0.25})
    (tmp_path / "7" / "task" / "9").mkdir()  # a thread that ended between the listing and the read
    assert run_delays(7, proc=str(tmp_path)) == {"7": 1.5, "8": 0.25}
    assert run_delays(8, proc=str(tmp_path)) == {}  # a process that is gone


def test_a_rank_waiting_for_a_cpu_extends_the_timeout_by_that_wait(tmp_path):
    _set(tmp_path, 10, {10: 5.0, 11: 1.0})  # before: whatever the threads waited earlier does not count
    _set(tmp_path, 20, {20: 0.0})
    s = Starvation([10, 20], timeout=10, start=100.0, proc=str(tmp_path))
    assert s.deadline() == 110.0
    assert s.extended(110.5) is None  # nothing waited: at the timeout the ranks still running are stuck
    _set(tmp_path, 10, {10: 9.0, 11: 3.0})  # the main thread waited 4 s more, a worker 2 s (overlapping: not added)
    assert s.waited() == pytest.approx(4.0)
    assert s.extended(110.5) == pytest.approx(114.0)
    assert s.extended(113.9) == pytest.approx(114.9)  # looked at again no sooner than STARVED_RECHECK_S
    _set(tmp_path, 20, {20: 0.0, 21: 6.0})  # a thread born since: all of its wait is since the start
    assert s.extended(110.5) == pytest.approx(116.0)


def test_a_rank_that_ended_keeps_the_wait_it_had(tmp_path):
    _set(tmp_path, 10, {10: 0.0})
    s = Starvation([10], timeout=10, start=0.0, proc=str(tmp_path))
    _set(tmp_path, 10, {10: 3.0})
    assert s.waited() == pytest.approx(3.0)
    (tmp_path / "10" / "task" / "10" / "schedstat").unlink()
    assert s.waited() == pytest.approx(3.0)


def test_the_extension_is_capped_so_an_endless_loop_is_still_named(tmp_path):
    _set(tmp_path, 10, {10: 0.0})
    s = Starvation([10], timeout=10, start=0.0, proc=str(tmp_path))
    _set(tmp_path, 10, {10: 1e6})
    assert s.deadline() == pytest.approx(10 + STARVED_EXTENSION_MAX * 10)
    assert s.extended(10 + STARVED_EXTENSION_MAX * 10 + 0.1) is None


def test_no_timeout_and_no_counts_change_nothing(tmp_path):
    assert Starvation([10], timeout=None, start=0.0, proc=str(tmp_path)).extended(1e9) is None
    s = Starvation([10, None], timeout=5, start=0.0, proc=str(tmp_path))  # no /proc counts (a sandbox): as before
    assert s.deadline() == 5.0 and s.extended(5.1) is None


def test_the_timeout_message_says_how_long_the_ranks_waited_for_a_cpu():
    from lab_utils.launcher.events import Rank, RankState

    rk = Rank(0, -1, -1, -1, -1)
    rk.state = RankState.RUNNING
    err = diagnostics.timeout_error([rk], [rk], {0: []}, 10, starved_s=42.4)
    assert "within 10 s (and the 42 s they waited for a CPU on a busy machine)" in str(err)
    assert "waited for a CPU" not in str(diagnostics.timeout_error([rk], [rk], {0: []}, 10))


# ------------------------------------------------------------------------------------------ real cgroups
@pytest.fixture
def starved_cgroup():
    """A child cgroup of this process's own with 0.05 CPU of quota; removed afterwards, its processes killed."""
    from lab_utils import cgroups

    if not os.path.exists("/proc/self/task/%d/schedstat" % os.getpid()):
        pytest.skip("this kernel keeps no run-queue delays (/proc/PID/task/TID/schedstat)")
    child = cgroups.Child.make(f"dtlabs-test-starved-{os.getpid()}", cpus=0.05)
    if child is None:
        pytest.skip("no child cgroup with a CPU quota can be made here (no write access to this process's cgroup, "
                    "or no cpu controller)")
    try:
        yield child
    finally:
        child.kill()
        assert child.remove(), f"cgroup left behind: {child.paths}"


@pytest.mark.slow
def test_a_process_starved_under_a_quota_is_busy_and_a_blocked_one_is_not(starved_cgroup):
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    block = subprocess.Popen([sys.executable, "-c", "import sys; print('up', flush=True); sys.stdin.read()"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert starved_cgroup.add(spin.pid) and starved_cgroup.add(block.pid)
        assert block.stdout.readline() == "up\n"  # the blocked one is up (slowly, under the quota) and goes to sleep
        time.sleep(0.2)
        start = time.monotonic()
        busy, stuck = Starvation([spin.pid], 1.0, start), Starvation([block.pid], 1.0, start)
        time.sleep(2.0)
        now = time.monotonic()
        assert busy.waited() > 1.0, "a process throttled to 0.05 CPU waited for a CPU most of 2 s"
        assert busy.extended(now) is not None
        assert stuck.waited() < 0.2 and stuck.extended(now) is None, "a blocked process is not waiting for a CPU"
        assert starved_cgroup.throttled() > 0
    finally:
        for p in (spin, block):
            p.kill()
            p.wait()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_rank_starved_of_cpu_is_not_named_stuck_but_a_deadlock_still_is(starved_cgroup):
    from lab_utils import launch
    from lab_utils.launcher.diagnostics import RankTimeoutError

    paths = starved_cgroup.paths

    def slow_rank1(paths):  # honest: rank 1 needs 0.6 CPU-s, 12 s at 0.05 CPU, past the 3 s timeout
        import os
        import time

        import torch
        import torch.distributed as dist

        if dist.get_rank() == 1:
            for path in paths:
                with open(os.path.join(path, "cgroup.procs"), "w") as f:
                    f.write(str(os.getpid()))
            t = time.process_time()
            while time.process_time() - t < 0.6:
                pass
        x = torch.ones(2)
        dist.all_reduce(x)
        return x.tolist()

    start = time.monotonic()
    assert launch(slow_rank1, world_size=2, args=(paths,), timeout=3, quiet=True) == [[2.0, 2.0]] * 2
    assert time.monotonic() - start > 3, "rank 1 finished within the timeout: it was not starved"

    def deadlock_rank0(paths):  # rank 0 waits in all_reduce for a rank 1 that never calls it, in the same quota
        import os

        import torch
        import torch.distributed as dist

        for path in paths:
            with open(os.path.join(path, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
        t = torch.ones(2)
        if dist.get_rank() == 0:
            dist.all_reduce(t)
        return t.tolist()

    start = time.monotonic()
    with pytest.raises(RankTimeoutError) as info:
        launch(deadlock_rank0, world_size=2, args=(paths,), timeout=3, quiet=True)
    elapsed = time.monotonic() - start
    assert info.value.stuck_ranks == [0]
    assert elapsed < 3 + 15, f"a real deadlock was named only after {elapsed:.0f} s"


SLOW_WORKER = """
import os, sys, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
if dist.get_rank() == 1:  # honest: 1 CPU-s of work, 20 s at 0.05 CPU, past the run's timeout
    for path in sys.argv[1:]:
        with open(os.path.join(path, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    t = time.process_time()
    while time.process_time() - t < 1.0:
        pass
x = torch.ones(2)
dist.all_reduce(x)
print("SUM", x.tolist(), flush=True)
dist.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_torchrun_worker_starved_of_cpu_finishes_past_the_run_s_timeout(starved_cgroup, tmp_path):
    """torchrun's wall-clock timeout counts as a launch's does: the time its workers waited for a CPU is added
    (a run that hangs without wanting one still stops: test_torchrun's timeout tests)."""
    from lab_utils.labkit.torchrun import processes_of, run_nodes

    script = tmp_path / "slow_worker.py"
    script.write_text(SLOW_WORKER)
    start = time.monotonic()
    result = run_nodes(str(script), *starved_cgroup.paths, nnodes=1, nproc_per_node=2, timeout=15, quiet=True)
    elapsed = time.monotonic() - start
    assert result.ok and result.output().count("SUM [2.0, 2.0]") == 2, result.output()[-2000:]
    assert elapsed > 15, "the worker finished within the timeout: it was not starved"
    assert not processes_of(result.run_id)
