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

from helpers import launch as h

TESTS = Path(__file__).resolve().parents[1]  # tests/: helpers is importable from there
pytestmark = pytest.mark.slow  # launching processes and 20 launches: tens of seconds (make test-fast leaves it out)

SLEEPER = textwrap.dedent(
    """
    import os, select, signal, sys
    from helpers import launch as h
    from lab_utils import launch
    # as ipykernel does: a runner that starts its jobs in the background has SIGINT ignored, and children inherit that
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if sys.argv[2] == "fork":  # as the grading subject does: the zygote is a fork of this process
        from lab_utils.launcher.zygote import fork_zygote
        r, w = os.pipe()
        fork_zygote(close_fds=(w,))
        os.close(w)  # our last copy: EOF at once, unless the zygote kept one
        print("EOF" if select.select([r], [], [], 10)[0] and os.read(r, 1) == b"" else "HELD", flush=True)
    try:
        launch(h.sleep_forever, world_size=2, args=(sys.argv[1],), timeout=300, quiet=True)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        sys.exit(0)
    """
)


def _start_sleeper(tmp_path, zygote="spawn"):
    proc = subprocess.Popen(
        [sys.executable, "-c", SLEEPER, str(tmp_path), zygote], cwd=TESTS, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])},
    )
    deadline = time.monotonic() + 60
    pidfiles = [tmp_path / "rank0.pid", tmp_path / "rank1.pid"]
    while not all(p.exists() and p.read_text() for p in pidfiles):
        assert proc.poll() is None, "the launching process died before its ranks started"
        assert time.monotonic() < deadline, "ranks did not start within 60 s"
        time.sleep(0.05)
    ranks = [int(p.read_text()) for p in pidfiles]
    zygotes = [c for c in psutil.Process(proc.pid).children() if c.name() == "dtlabs-zygote"]
    assert len(zygotes) == 1
    forked = zygotes[0].cmdline() == psutil.Process(proc.pid).cmdline()  # no interpreter of its own
    assert forked == (zygote == "fork"), f"the zygote should be {zygote}ed: {zygotes[0].cmdline()}"
    if zygote == "fork":
        assert proc.stdout.readline().strip() == "EOF", "the forked zygote kept a descriptor it was told to close"
    return proc, ranks, zygotes[0].pid


@pytest.mark.parametrize("zygote", ["spawn", "fork"])
def test_kernel_interrupt_stops_every_rank(tmp_path, zygote):
    proc, ranks, _ = _start_sleeper(tmp_path, zygote)
    proc.send_signal(signal.SIGINT)  # what "Interrupt the kernel" does to ipykernel
    out, _ = proc.communicate(timeout=30)  # the ranks sleep for 300 s: returning at all means they were stopped
    assert "interrupted" in out, "KeyboardInterrupt must reach the caller after the ranks are stopped"
    assert not h.wait_gone(ranks, timeout=5), "ranks survived a kernel interrupt"


@pytest.mark.parametrize("zygote", ["spawn", "fork"])
def test_kernel_death_takes_ranks_and_zygote_with_it(tmp_path, zygote):
    proc, ranks, zygote_pid = _start_sleeper(tmp_path, zygote)
    proc.kill()  # a crashed or restarted kernel: no chance to clean up
    proc.wait(timeout=10)
    alive = h.wait_gone(ranks + [zygote_pid], timeout=5)
    assert not alive, f"orphans after the launching process was SIGKILLed: {alive}"


CONCURRENT = textwrap.dedent(
    """
    import os, sys, time
    from helpers import launch as h
    from lab_utils import launch, prewarm
    prewarm(wait=True)  # torch imported: from here on only rendezvous can clash
    open(os.path.join(sys.argv[1], f"ready{os.getpid()}"), "w").close()
    while not os.path.exists(os.path.join(sys.argv[1], "go")):
        time.sleep(0.01)
    for _ in range(int(sys.argv[2])):
        out = launch(h.all_reduce_rank_plus_one, world_size=2, timeout=240, quiet=True)
        print("RESULT", [t.tolist() for t in out], flush=True)
    """
)
NOTEBOOKS, LAUNCHES_EACH = 5, 4


def test_twenty_launches_from_five_notebooks_at_once_without_port_clashes(tmp_path):
    """Every launch hosts its own rendezvous store: 5 processes released at the same instant, 4 launches each,
    keep 5 stores starting side by side 4 times over (a fixed or guessed port would clash here)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
        "DTLABS_WARM_IMPORTS": "0",  # only torch: the launching processes share 2 cores here
    }
    procs = [
        subprocess.Popen([sys.executable, "-c", CONCURRENT, str(tmp_path), str(LAUNCHES_EACH)], cwd=TESTS, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(NOTEBOOKS)
    ]
    deadline = time.monotonic() + 240
    while len(list(tmp_path.glob("ready*"))) < NOTEBOOKS:
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), (
            "the launching processes did not all get ready:\n" + "\n".join(p.communicate()[0][-2000:] for p in procs
                                                                           if p.poll() is not None))
        time.sleep(0.05)
    descendants = set()
    for proc in procs:
        descendants |= {c.pid for c in psutil.Process(proc.pid).children(recursive=True)}
    (tmp_path / "go").touch()
    outputs = []
    for proc in procs:
        out = proc.communicate(timeout=300)[0]
        outputs.append((proc.returncode, out))
    ok = "RESULT [[3.0, 3.0, 3.0, 3.0], [3.0, 3.0, 3.0, 3.0]]"
    failures = [out for code, out in outputs if code != 0 or out.count(ok) != LAUNCHES_EACH]
    assert not failures, f"{len(failures)} of {NOTEBOOKS} launching processes failed; first:\n{failures[0][-3000:]}"
    assert not h.wait_gone(descendants, timeout=10), "processes survived after the launching processes exited"


SLOW_WARMUP = textwrap.dedent(
    """
    import sys
    from helpers import launch as h
    from lab_utils import RankFailedError, launch
    from lab_utils.launcher import zygote
    # a zygote that spends seconds in each warm import, as a CUDA build of torch does in torch._dynamo; it answers
    # the launcher only between two imports
    zygote.WARM_IMPORTS[:] = ["slow_warm_import_1", "slow_warm_import_2", "slow_warm_import_3"]
    zygote.fork_zygote()
    try:
        launch(h.rank1_killed, world_size=2, timeout=60, quiet=True)
    except RankFailedError as exc:
        print(str(exc).splitlines()[0], flush=True)
    """
)


def test_a_rank_killed_while_the_zygote_warms_up_is_still_named_by_its_signal(tmp_path):
    """The exit status of a rank reaches the launcher only when the zygote is between two warm imports: the
    launcher waits for it rather than reporting 'exited with code None'."""
    for i in (1, 2, 3):
        (tmp_path / f"slow_warm_import_{i}.py").write_text("import time\ntime.sleep(4)\n")
    path = os.pathsep.join([str(TESTS), str(tmp_path), os.environ.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-c", SLOW_WARMUP], cwd=TESTS, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": path, "DTLABS_WARM_IMPORTS": "1"})
    assert "rank 1 was killed by SIGKILL" in out.stdout, out.stdout + out.stderr
