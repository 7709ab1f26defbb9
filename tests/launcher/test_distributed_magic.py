"""``%%distributed`` in a real Jupyter kernel: persistent ranks, interrupts, deadlock and death reports, restarts,
and nothing left running (rank grandchildren included) after a launch, ``%dist stop`` or the kernel's end.

One kernel serves the whole module (a cold zygote costs seconds on a loaded machine); the tests run in file
order and each leaves the group running for the next. The module's token marks every process the kernel
starts; the last test shuts the kernel down and asserts that none of them survived.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import nbformat
import psutil
import pytest

from helpers.processes import TEST_TOKEN_VAR, assert_no_leftovers
from jupyter_core.utils import run_sync
from nbclient import NotebookClient

from lab_utils.launcher.backend import choose_backend
from lab_utils.grading.split.kernels import PrivateSocketKernelManager

# slow: one kernel and ranks for the module (make test-fast leaves it out); one xdist worker runs the module in order
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("distributed_magic")]

WAIT_S = 30  # bound on every wait for a process or a file; never a speed assertion


class Kernel:
    def __init__(self, client, nb, token):
        self.client, self.nb, self.token = client, nb, token

    def run(self, source: str):
        cell = nbformat.v4.new_code_cell(source)
        self.nb.cells.append(cell)
        self.client.execute_cell(cell, len(self.nb.cells) - 1)
        return cell

    @staticmethod
    def text(cell) -> str:
        parts = []
        for o in cell.outputs:
            if o.output_type == "stream":
                parts.append(o.text)
            elif o.output_type in ("display_data", "execute_result"):
                parts.append(o.data.get("text/plain", "") + "\n")
            elif o.output_type == "error":
                parts.append(f"{o.ename}: {o.evalue}\n")
        return "".join(parts)

    @staticmethod
    def error(cell):
        return next((o for o in cell.outputs if o.output_type == "error"), None)


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    token = uuid.uuid4().hex
    path = tmp_path_factory.mktemp("dist_magic")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(TEST_TOKEN_VAR, token)
        nb = nbformat.v4.new_notebook()
        client = NotebookClient(nb, timeout=120, kernel_name="python3", allow_errors=True,
                                kernel_manager_class=PrivateSocketKernelManager,
                                resources={"metadata": {"path": str(path)}})
        with client.setup_kernel():
            k = Kernel(client, nb, token)
            k.path = path
            cell = k.run("%load_ext lab_utils\n%dist start -n 2 --timeout 20")
            assert "[dist] 2 ranks started" in k.text(cell), k.text(cell)
            yield k
    assert_no_leftovers(token)


def _gone(pids, wait_s=WAIT_S) -> list:
    """The pids still alive (not zombies) after waiting up to ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while True:
        alive = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.Error:
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def _pids_in(text: str) -> list:
    return [int(p) for p in re.findall(r"\b(\d{2,})\b", " ".join(re.findall(r"PIDS\[([^\]]*)\]", text)))]


SPAWN = (
    "import subprocess\n"
    "plain = subprocess.Popen(['sleep', '300'])\n"
    "own_session = subprocess.Popen(['sleep', '301'], start_new_session=True)\n"
    "print(f'PIDS[{plain.pid} {own_session.pid}]')\n"
)


def test_state_lives_on_each_rank_across_cells(kernel):
    kernel.run("%%distributed\nt = torch.ones(2) * (rank + 1)")
    cell = kernel.run("%%distributed\ndist.all_reduce(t)\nprint('sum on', rank, t.tolist())\nt * 0 + rank")
    out = kernel.text(cell)
    assert "[rank 0] sum on 0 [3.0, 3.0]" in out and "[rank 1] sum on 1 [3.0, 3.0]" in out, out
    assert "[rank 0] tensor([0., 0.])" in out and "[rank 1] tensor([1., 1.])" in out, out  # last expression
    cell = kernel.run("%%rank 1\nonly_one = rank * 7\nonly_one")
    assert kernel.text(cell).strip() == "[rank 1] 7", kernel.text(cell)
    cell = kernel.run("pulled = %dist pull t\nprint([x.tolist() for x in pulled])")
    assert "[[3.0, 3.0], [3.0, 3.0]]" in kernel.text(cell), kernel.text(cell)
    cell = kernel.run("%dist status")
    out = kernel.text(cell)
    assert choose_backend(2, "auto").reason in out and out.count(": pid ") == 2, out


def test_a_figure_a_rank_draws_appears_in_the_cell(kernel):
    cell = kernel.run("%%rank 0\nimport matplotlib.pyplot as plt\nplt.plot([0, 1], [1, 0])\nNone")
    assert any(o.output_type == "display_data" and "image/png" in o.data for o in cell.outputs), cell.outputs


def test_interrupt_stops_every_rank_with_keyboard_interrupt_and_keeps_state(kernel):
    marks = kernel.path / "started"
    marks.mkdir()

    def interrupt_when_both_ranks_loop():
        deadline = time.monotonic() + WAIT_S
        while len(list(marks.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        run_sync(kernel.client.km.interrupt_kernel)()  # the kernel's stop button

    kernel.run("%%distributed\nkept = torch.ones(2) * (rank + 1)")  # this test's own state, not an earlier test's
    threading.Thread(target=interrupt_when_both_ranks_loop, daemon=True).start()
    cell = kernel.run(
        "%%distributed\nimport pathlib, time\n"
        f"pathlib.Path({str(marks)!r}, str(rank)).touch()\n"
        "for step in range(6000):\n    time.sleep(0.01)\n"
    )
    out = kernel.text(cell)
    assert kernel.error(cell) is not None and kernel.error(cell).ename == "KeyboardInterrupt", out
    for r in (0, 1):
        assert f"[dist] rank {r} interrupted at Cell In[" in out and "line 5" in out, out
    assert "variables are kept" in out, out
    cell = kernel.run("%%distributed\n(step < 5999, kept.tolist())")  # the loop stopped early; state kept
    out = kernel.text(cell)
    assert "[rank 0] (True, [1.0, 1.0])" in out and "[rank 1] (True, [2.0, 2.0])" in out, out


def test_a_collective_not_every_rank_entered_is_named_then_the_group_restarts(kernel):
    cell = kernel.run("%%distributed --timeout 3\nx = torch.ones(1)\nif rank == 0:\n    dist.all_reduce(x)\n")
    out = kernel.text(cell)
    err = kernel.error(cell)
    assert err is not None and err.ename == "RankTimeoutError", out
    assert "rank 0 is waiting in all_reduce at Cell In[" in err.evalue and "line 4" in err.evalue, err.evalue
    assert "dist.all_reduce(x)" in err.evalue, err.evalue
    assert "torn down and restarted" in out and "variables were lost" in out, out
    cell = kernel.run("%%distributed\n't' in globals(), rank")
    out = kernel.text(cell)
    assert "[rank 0] (False, 0)" in out and "[rank 1] (False, 1)" in out, out


def test_a_rank_that_raises_is_reported_with_its_traceback_and_peers_are_freed(kernel):
    cell = kernel.run("%%distributed\nkeep = rank\nif rank == 1:\n    raise ValueError('bad shard')\n"
                      "else:\n    import time\n    time.sleep(60)\n")
    err = kernel.error(cell)
    assert err is not None and err.ename == "RankFailedError", kernel.text(cell)
    assert err.evalue.startswith("rank 1 raised ValueError: bad shard"), err.evalue
    assert "raise ValueError('bad shard')" in err.evalue, err.evalue
    assert "[dist] rank 0 stopped after the failure" in kernel.text(cell), kernel.text(cell)
    cell = kernel.run("%%distributed\nkeep")  # no restart was needed: state kept
    assert "[rank 0] 0" in kernel.text(cell) and "[rank 1] 1" in kernel.text(cell), kernel.text(cell)


def test_a_dead_rank_is_reported_the_group_stopped_and_restart_gives_a_fresh_one(kernel):
    cell = kernel.run("%%distributed\nimport os\nif rank == 1:\n    os._exit(3)\ndist.barrier()\n")
    out = kernel.text(cell)
    err = kernel.error(cell)
    assert err is not None and "rank 1 exited with code 3" in err.evalue, out
    assert "the group was stopped" in out, out
    cell = kernel.run("%%distributed\nrank")
    assert kernel.error(cell) is not None and "%dist start" in kernel.error(cell).evalue, kernel.text(cell)
    cell = kernel.run("%dist restart")
    assert "[dist] 2 ranks started" in kernel.text(cell), kernel.text(cell)
    cell = kernel.run("%%distributed\n'keep' in globals(), rank")
    assert "[rank 0] (False, 0)" in kernel.text(cell) and "[rank 1] (False, 1)" in kernel.text(cell)


def test_rank_grandchildren_are_reaped_after_a_launch_and_after_dist_stop(kernel):
    cell = kernel.run(
        "from lab_utils import launch\n"
        "def spawn():\n" + "".join(f"    {line}\n" for line in SPAWN.splitlines()) +
        "launch(spawn, world_size=2, quiet=True)"
    )
    pids = _pids_in(kernel.text(cell))
    assert len(pids) == 4, kernel.text(cell)
    assert _gone(pids) == [], f"children of launch() ranks survived it: {pids}"

    cell = kernel.run("%%distributed\n" + SPAWN)
    pids = _pids_in(kernel.text(cell))
    assert len(pids) == 4 and _gone(pids, wait_s=0) == pids, kernel.text(cell)  # alive while the group is
    cell = kernel.run("%dist stop")
    assert "ranks stopped" in kernel.text(cell)
    assert _gone(pids) == [], f"children of %%distributed ranks survived %dist stop: {pids}"


def test_kernel_shutdown_leaves_no_process(kernel):
    kernel.run("%dist start -n 2")
    cell = kernel.run("%%distributed\n" + SPAWN)
    pids = _pids_in(kernel.text(cell))
    assert len(pids) == 4, kernel.text(cell)
    run_sync(kernel.client.km.shutdown_kernel)(now=False)  # a clean shutdown: the kernel runs its atexit hooks
    assert _gone(pids) == [], f"rank children survived the kernel: {pids}"
    assert_no_leftovers(kernel.token)


def test_a_killed_launcher_takes_ranks_and_their_children_along(no_leaked_processes, tmp_path):
    """SIGKILL of the process that called launch(): the zygote gets its parent-death signal and kills everything."""
    script = tmp_path / "victim.py"
    script.write_text(
        "import sys, time\nfrom lab_utils import launch\n"
        "def spawn():\n" + "".join(f"    {line}\n" for line in SPAWN.splitlines()) +
        "    time.sleep(300)\n"
        "launch(spawn, world_size=2, quiet=True, timeout=300)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                                      os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env)
    lines = []
    deadline = time.monotonic() + 90
    while len(_pids_in("".join(lines))) < 4 and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
    pids = _pids_in("".join(lines))
    assert len(pids) == 4, "".join(lines)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=WAIT_S)
    assert _gone(pids) == [], f"rank children survived the launcher's death: {pids}"
