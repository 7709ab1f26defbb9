"""`dtlabs stress`: an honest solution gets full marks on every run, with the machine's other cores busy.

The labs listed in STRESS_LABS race processes or depend on timing (Lab 05 starts real torchrun agents and kills
one mid-run). With DTLABS_STRESS_K=K this grades each of them K times with the other cores busy; `make stress K=10`
grades every lab 10 times. `make test` leaves that out (one autograde of Lab 05 under load takes minutes): there,
test_labs.py grades Lab 05's solution once while the other pytest worker loads the machine.
"""
from __future__ import annotations

import io
import os
import subprocess
import sys
import time

import psutil
import pytest

from lab_utils.grading.quality import stress

STRESS_LABS = ["05_multi_node"]
K = int(os.environ.get("DTLABS_STRESS_K", "0"))


@pytest.mark.slow
@pytest.mark.skipif(K < 1, reason="set DTLABS_STRESS_K=K (or run make stress): K gradings under load take minutes each")
@pytest.mark.timeout(max(600, 1500 * max(K, 1)))
@pytest.mark.parametrize("lab", STRESS_LABS)
def test_solution_gets_full_marks_every_run_under_load(lab, no_leaked_processes):
    out = io.StringIO()
    runs = stress.stress([lab], k=K, out=out)
    assert len(runs) == K
    bad = [r for r in runs if not r.full]
    assert not bad, f"{len(bad)} of {K} runs of {lab} lost points under load:\n{stress.summary(runs)}\n\n" + \
        out.getvalue()[-4000:]


def test_busy_cores_are_started_and_always_stopped():
    with pytest.raises(RuntimeError):
        with stress.busy_cores(2) as load:
            pids = [p.pid for p in load.procs]
            assert len(pids) == 2
            time.sleep(0.5)
            assert all(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
                       for pid in pids)
            raise RuntimeError("a failing grade run")
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
                   for pid in pids), "a busy loop survived the stress command"
    assert stress.busy_cores().n == max(0, (os.cpu_count() or 1) - 1)


def test_busy_loops_die_with_their_parent():
    """Killed with SIGKILL (no finally runs), the command still leaves no busy loop behind."""
    code = ("import sys, time; from lab_utils.grading.quality import stress; b = stress.busy_cores(1).__enter__(); "
            "print(b.procs[0].pid, flush=True); time.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        pid = int(parent.stdout.readline())
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 10
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the busy loop outlived its parent"
        time.sleep(0.1)


def test_report_names_the_failing_cell_and_its_error():
    bad = stress.StressRun("05_multi_node", 3, {"test_train": (0.0, 3.0), "test_alpha_beta": (2.0, 2.0)}, 41.0,
                           errors={"test_train": "AssertionError: rank 1 killed at step 5: torchrun did not finish"})
    good = stress.StressRun("05_multi_node", 4, {"test_train": (3.0, 3.0)}, 40.0)
    assert good.full and not bad.full and bad.points == (2.0, 5.0)
    text = stress.summary([bad, good])
    assert "05_multi_node" in text and "1/2" in text
    assert "run 3: 2/5" in text and "test_train 0/3: AssertionError: rank 1 killed" in text
    assert "test_alpha_beta" not in text.split("lost points:")[1]


def test_repeated_test_runs_report_every_run_that_failed_and_which_test(tmp_path):
    """`dtlabs stress --tests`: a test that fails only on its second run is caught and named."""
    counter = tmp_path / "runs"
    (tmp_path / "test_flaky.py").write_text(
        "import pathlib\n"
        f"COUNTER = pathlib.Path({str(counter)!r})\n"
        "def test_steady():\n    pass\n"
        "def test_flaky():\n"
        "    n = int(COUNTER.read_text()) + 1 if COUNTER.exists() else 1\n"
        "    COUNTER.write_text(str(n))\n"
        "    assert n != 2, 'the second run fails'\n")
    out = io.StringIO()
    runs = stress.stress_tests([str(tmp_path / "test_flaky.py")], k=3, busy=0, out=out)
    assert [rc for rc, _, _ in runs] == [0, 1, 0], out.getvalue()
    assert len(runs[1][1]) == 1 and runs[1][1][0].endswith("test_flaky.py::test_flaky"), out.getvalue()
    assert "2/3 runs passed" in out.getvalue() and "FAILED" in out.getvalue()


def test_stress_takes_pytest_options_as_one_argument():
    """`make stress-tests` passes options such as `-n 2`: they must reach pytest, not dtlabs' own parser."""
    from lab_utils import cli

    args = cli.build_parser().parse_args(["stress", "--tests", "-n 2 tests/labkit/test_torchrun.py", "--k", "3"])
    assert args.tests == "-n 2 tests/labkit/test_torchrun.py" and args.k == 3
