"""Nothing survives and nothing clashes: kernel interrupt, kernel death, many notebooks launching at once.

Each test drives a separate Python process (standing in for a Jupyter kernel) and counts, with psutil,
the rank and zygote processes it leaves behind.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

import launch_helpers as h

TESTS = Path(__file__).parent

SLEEPER = textwrap.dedent(
    """
    import sys
    import launch_helpers as h
    from lab_utils import launch
    try:
        launch(h.sleep_forever, world_size=2, args=(sys.argv[1],), timeout=300, quiet=True)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        sys.exit(0)
    """
)


def _start_sleeper(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-c", SLEEPER, str(tmp_path)], cwd=TESTS, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])},
    )
    deadline = time.monotonic() + 60
    pidfiles = [tmp_path / "rank0.pid", tmp_path / "rank1.pid"]
    while not all(p.exists() and p.read_text() for p in pidfiles):
        assert proc.poll() is None, "the launching process died before its ranks started"
        assert time.monotonic() < deadline, "ranks did not start within 60 s"
        time.sleep(0.05)
    ranks = [int(p.read_text()) for p in pidfiles]
    zygotes = [c.pid for c in psutil.Process(proc.pid).children() if c.name() == "dtlabs-zygote"]
    assert len(zygotes) == 1
    return proc, ranks, zygotes[0]


def test_kernel_interrupt_stops_every_rank(tmp_path):
    proc, ranks, _ = _start_sleeper(tmp_path)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)  # what "Interrupt the kernel" does to ipykernel
    out, _ = proc.communicate(timeout=30)
    assert "interrupted" in out, "KeyboardInterrupt must reach the caller after the ranks are stopped"
    assert not h.wait_gone(ranks, timeout=5), "ranks survived a kernel interrupt"
    assert time.monotonic() - t0 < 10


def test_kernel_death_takes_ranks_and_zygote_with_it(tmp_path):
    proc, ranks, zygote = _start_sleeper(tmp_path)
    proc.kill()  # a crashed or restarted kernel: no chance to clean up
    proc.wait(timeout=10)
    alive = h.wait_gone(ranks + [zygote], timeout=5)
    assert not alive, f"orphans after the launching process was SIGKILLed: {alive}"


CONCURRENT = textwrap.dedent(
    """
    import launch_helpers as h
    from lab_utils import launch
    out = launch(h.all_reduce_rank_plus_one, world_size=2, timeout=240, quiet=True)
    print("RESULT", [t.tolist() for t in out], flush=True)
    """
)


def test_twenty_notebooks_launch_at_once_without_port_clashes():
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
        "DTLABS_WARM_IMPORTS": "0",  # only torch: 20 launching processes share 2 cores here
    }
    procs = [
        subprocess.Popen([sys.executable, "-c", CONCURRENT], cwd=TESTS, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
        for _ in range(20)
    ]
    descendants = set()
    outputs = []
    for proc in procs:
        try:
            descendants |= {c.pid for c in psutil.Process(proc.pid).children(recursive=True)}
        except psutil.NoSuchProcess:
            pass
        out, _ = proc.communicate(timeout=300)
        outputs.append((proc.returncode, out))
    failures = [out for code, out in outputs if code != 0 or "RESULT [[3.0, 3.0, 3.0, 3.0], [3.0, 3.0, 3.0, 3.0]]" not in out]
    assert not failures, f"{len(failures)} of 20 concurrent launches failed; first:\n{failures[0][-3000:]}"
    assert not h.wait_gone(descendants, timeout=10), "processes survived after 20 launching processes exited"
