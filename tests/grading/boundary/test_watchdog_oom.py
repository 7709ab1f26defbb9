"""The watchdog names a submission the kernel's out-of-memory killer stopped, from the grading's memory cgroup's own
counters, and says whose it is: the student's where the cgroup had the submission's allowance free (so reaching its
limit took more than that), the machine's where it had less (fewer at once, or more memory). Real cgroups: a child of
this test process's own with a memory limit, a "grader" Python in it holding a ``Box`` around a process that
allocates past the limit faster than the watchdog looks."""
from __future__ import annotations

import sys

import pytest

from helpers.cgroups import child_cgroup, run_in  # noqa: F401 - a fixture
from lab_utils.grading.outcomes import Kind, Reason

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="cgroups are Linux's")

GRADER = """
    import subprocess, sys
    from lab_utils.grading.boundary.watchdog import Box, Limits

    hog = subprocess.Popen([sys.executable, "-c", "b = [bytearray(40 << 20) for _ in range(40)]"])
    box = Box(hog, "bwrap", Limits(memory_mb={memory_mb}))  # no watchdog thread: only the counters can tell
    hog.wait()
    print("EXIT", hog.returncode)
    print("REASON", box.oom_reason())
"""


def _reason(child_cgroup, cgroup_mb: int, memory_mb: int) -> tuple[str, object]:
    child = child_cgroup(memory_bytes=cgroup_mb << 20)
    run = run_in(child, GRADER.format(memory_mb=memory_mb), timeout=60)
    assert run.returncode == 0, run.stderr[-3000:]
    mem = child.memory()
    if not mem.oom_kills and not mem.failcnt:
        pytest.skip(f"this kernel's memory cgroup counted no OOM kill nor limit hit ({mem})")
    assert "EXIT -9" in run.stdout, run.stdout
    text = run.stdout.split("REASON ", 1)[1].strip()
    return text, Reason.parse(f"sandbox: {text}")


def test_a_submission_past_its_allowance_is_the_students_reason(child_cgroup):
    text, reason = _reason(child_cgroup, cgroup_mb=400, memory_mb=100)
    assert reason.kind is Kind.STUDENT and "memory limit" in text and "100 MB" in text, text
    assert "out-of-memory killer" in text


def test_a_machine_limit_below_the_allowance_is_the_environments_reason(child_cgroup):
    text, reason = _reason(child_cgroup, cgroup_mb=300, memory_mb=2000)
    assert reason.kind is Kind.ENVIRONMENT, text
    assert "memory limit of 300 MB" in text and "2000 MB" in text and "--jobs" in text, text
