"""Real child cgroups for tests (tests/launcher/test_cpu_budget.py, tests/grading/boundary/test_watchdog_oom.py):
made under the test process's own cgroup, a fresh Python moved in before it starts, killed and removed afterwards;
the test skipped, with the reason, where none can be made here."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from lab_utils import cgroups


@pytest.fixture
def child_cgroup():
    """``make(cpus=..., memory_bytes=...)``: a child cgroup of this process's own, killed and removed after."""
    made = []

    def make(**limits):
        child = cgroups.Child.make(f"dtlabs-test-{os.getpid()}-{len(made)}", **limits)
        if child is None:
            pytest.skip(f"no child cgroup with {limits} can be made under this process's own here "
                        f"(cpu: {cgroups.folders('cpu')[:1]}, memory: {cgroups.folders('memory')[:1]}, "
                        f"v2: {cgroups.folders(cgroups.V2)[:1]}; uid {os.getuid()})")
        made.append(child)
        return child

    yield make
    for child in made:
        child.kill()
        assert child.remove(), f"{child} could not be removed"


def run_in(child, script: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """Run ``script`` in a fresh Python moved into ``child`` before it starts (so whatever it starts is too)."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", cgroups.BUDGET_ENV)}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=env, capture_output=True, text=True,
                          timeout=timeout, preexec_fn=lambda: child.add(os.getpid()) or None)
