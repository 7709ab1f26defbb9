"""torchrun's agents and workers forked from the harness's warm servers (lab_utils.labkit.torchrun.warmstart): a
forked worker sees what a cold ``python -u SCRIPT`` sees, torchrun still restarts and stops it, and nothing outlives
the run.

The first test runs the same script both ways and compares what the workers report, so a difference between a forked
and a cold worker (its path, argv, environment, streams, session, collector) fails by name.
"""
from __future__ import annotations

import json
import re
import textwrap

import pytest
import torch

from lab_utils import warm
from lab_utils.labkit.torchrun import processes_of, run_nodes, warmstart

pytestmark = pytest.mark.slow  # real torchrun agents and workers


@pytest.fixture(autouse=True)
def _nothing_survives(no_leaked_processes):
    yield


REPORT = textwrap.dedent(
    """
    import gc, json, os, sys
    import psutil
    import torch

    me = psutil.Process()


    def agent_parent(p):  # the parent's name of an agent of this run, else None (other processes come and go)
        try:
            if ("lab_utils.labkit.torchrun.agent" in " ".join(p.cmdline())
                    and p.environ().get("DTLABS_RUN_ID") == os.environ["DTLABS_RUN_ID"]):
                return p.parent().name()
        except psutil.Error:
            pass
        return None


    with open("/proc/self/environ", "rb") as fh:
        environ = dict(kv.split(b"=", 1) for kv in fh.read().split(b"\\0") if b"=" in kv)
    # one write, so the line stays whole (print under -u writes the text and its newline apart, and the other
    # worker's line, on the same pipe, once came between them)
    sys.stdout.write("REPORT " + json.dumps({
        "name": __name__, "argv": sys.argv, "path0": sys.path[0], "cwd": os.getcwd(),
        "rank": os.environ["RANK"], "local_rank": os.environ["LOCAL_RANK"],
        "marker_in_proc": b"DTLABS_RUN_ID" in environ, "local_rank_in_proc": environ.get(b"LOCAL_RANK", b"").decode(),
        # a forked worker's command line is NUL-padded to the room the server left for it
        "cmdline": [a for a in me.cmdline()[1:] if a], "session_leader": os.getsid(0) == os.getpid(),
        "stdout_write_through": sys.stdout.write_through, "collector": gc.isenabled(),
        "threads": torch.get_num_threads(), "parent": me.parent().name(),
        "agent_parents": sorted({agent_parent(p) for p in psutil.process_iter()} - {None}),
    }) + "\\n")
    sys.stdout.flush()
    """
)


def _reports(script, **kw) -> list[dict]:
    result = run_nodes(script, "an-arg", nnodes=1, nproc_per_node=2, timeout=120, quiet=True, **kw)
    assert result.ok, result.lines
    assert not processes_of(result.run_id), "a process of the finished run is still alive"
    reports = [json.loads(text.split(" ", 1)[1]) for _, text in result.lines if text.startswith("REPORT ")]
    return sorted(reports, key=lambda r: r["rank"])


def test_a_forked_worker_sees_what_a_cold_one_does(tmp_path, monkeypatch):
    script = tmp_path / "report.py"
    script.write_text(REPORT)
    monkeypatch.setenv("DTLABS_WARM_TORCHRUN", "0")
    cold = _reports(str(script))
    monkeypatch.setenv("DTLABS_WARM_TORCHRUN", "1")
    forked = _reports(str(script))
    assert [r.pop("parent") for r in forked] == ["dtlabs-warm"] * 2, "the workers were not forked by the warm server"
    assert [r.pop("agent_parents") for r in forked] == [["dtlabs-warm"]] * 2, "the agent was not forked either"
    assert all(r.pop("parent") != "dtlabs-warm" and r.pop("agent_parents") != ["dtlabs-warm"] for r in cold)
    assert forked == cold
    first = cold[0]
    assert first["name"] == "__main__" and first["argv"] == [str(script), "an-arg"]
    assert first["path0"] == str(tmp_path) and first["cmdline"] == ["-u", str(script), "an-arg"]
    assert first["marker_in_proc"] and first["local_rank_in_proc"] == "0", "psutil must find the run's marker"
    assert first["session_leader"] and first["stdout_write_through"] and first["collector"]


FAILS_ONCE = textwrap.dedent(
    """
    import os, sys
    import torch.distributed as dist

    dist.init_process_group("gloo")
    dist.barrier()
    restarts, rank = int(os.environ["TORCHELASTIC_RESTART_COUNT"]), dist.get_rank()
    print(f"ATTEMPT {restarts} RANK {rank} PARENT {os.getppid()}", flush=True)
    dist.destroy_process_group()
    if restarts == 0 and rank == 1:
        sys.exit(3)  # torchrun stops the other worker and restarts both
    """
)


def test_torchrun_restarts_forked_workers_and_they_fork_again(tmp_path):
    script = tmp_path / "fails_once.py"
    script.write_text(FAILS_ONCE)
    result = run_nodes(str(script), nnodes=1, nproc_per_node=2, max_restarts=1, rdzv="c10d",
                        timeout=180, quiet=True)
    assert result.ok, result.lines
    attempts = sorted(re.findall(r"ATTEMPT \d RANK \d PARENT \d+", "\n".join(text for _, text in result.lines)))
    assert [a.split()[:4] for a in attempts] == [["ATTEMPT", "0", "RANK", "0"], ["ATTEMPT", "0", "RANK", "1"],
                                                 ["ATTEMPT", "1", "RANK", "0"], ["ATTEMPT", "1", "RANK", "1"]]
    servers = {s.proc.pid for k, s in warm._SERVERS.items() if k[0] == warmstart.WORKER.name}
    assert {int(a.split()[-1]) for a in attempts} <= servers, "a worker (or its restart) did not fork from the server"


NCCL = textwrap.dedent(
    """
    import os
    import psutil
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    t = torch.ones(4, device="cuda") * (dist.get_rank() + 1)
    dist.all_reduce(t)
    torch.cuda.synchronize()
    print("NCCL", dist.get_backend(), sum(t.tolist()), psutil.Process().parent().name(), flush=True)
    dist.destroy_process_group()
    """
)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 1, reason="needs a CUDA GPU")
def test_a_forked_worker_runs_nccl_on_the_gpu(tmp_path):
    """The server imported torch and never CUDA: a worker it forks initialises CUDA and NCCL as a cold one does."""
    script = tmp_path / "nccl.py"
    script.write_text(NCCL)
    n = min(torch.cuda.device_count(), 2)
    result = run_nodes(str(script), nnodes=1, nproc_per_node=n, timeout=120, quiet=True)
    assert result.ok, result.lines
    got = sorted(text for _, text in result.lines if text.startswith("NCCL"))
    expected = 4.0 * sum(range(1, n + 1))
    assert got == [f"NCCL nccl {expected} dtlabs-warm"] * n, result.lines
