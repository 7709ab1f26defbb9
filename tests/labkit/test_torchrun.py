"""lab_utils.labkit.torchrun: real torchrun agents on loopback run a job, stream it, and never leave a process behind.

Each torchrun run costs a few seconds (every agent and worker imports torch), so the tests keep to four runs.
Processes are counted with psutil: by the pids the workers write, and by the run's DTLABS_RUN_ID marker.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil
import pytest


from helpers.launch import wait_gone

from lab_utils.labkit import torchrun as tr
from lab_utils.labkit.torchrun import agent, nodes, reaping
from lab_utils.labkit.torchrun import TorchrunTimeout, processes_of, run_nodes

pytestmark = pytest.mark.slow  # real torchrun agents and workers: seconds per test (make test-fast leaves them out)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _nothing_survives(no_leaked_processes, tmp_path_factory, monkeypatch):
    """conftest's check: no process started under this test's token (agents, workers) outlives the test; and no
    file either: the temporary folder of the harness, its agents and workers is empty afterwards (torchrun's own
    log folders, torchelastic_*, were left in /tmp by every run)."""
    temp = tmp_path_factory.mktemp("tempdir")
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    monkeypatch.setenv("TMPDIR", str(temp))
    yield
    # torchinductor_<user>: the cache torch in this pytest process may make on a first use, not something of the run
    left = sorted(name for name in os.listdir(temp) if not name.startswith("torchinductor_"))
    assert left == [], "the run left these in the temporary folder"

ALL_REDUCE = textwrap.dedent(
    """
    import os
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.full((2,), float(dist.get_rank() + 1))
    dist.all_reduce(t)
    keys = ("RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE")
    print("RESULT", *(os.environ[k] for k in keys), t.tolist(), flush=True)
    dist.destroy_process_group()
    """
)

SLEEPER = textwrap.dedent(
    """
    import os, sys, time
    with open(os.path.join(sys.argv[1], f"worker{os.environ['RANK']}.pid"), "w") as f:
        f.write(str(os.getpid()))
    time.sleep(600)
    """
)


def _script(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _wait_for_pids(folder, n, proc, timeout=120.0):
    deadline = time.monotonic() + timeout
    files = [folder / f"worker{r}.pid" for r in range(n)]
    while not all(f.exists() and f.read_text() for f in files):
        assert proc.poll() is None, f"the launching process exited early:\n{proc.stdout.read() if proc.stdout else ''}"
        assert time.monotonic() < deadline, f"workers did not start within {timeout} s"
        time.sleep(0.1)
    return [int(f.read_text()) for f in files]


def test_two_static_nodes_train_stream_and_exit_clean(tmp_path, capsys):
    script = _script(tmp_path, "all_reduce.py", ALL_REDUCE)
    result = run_nodes(script, nnodes=2, nproc_per_node=1, rdzv="static", timeout=120)
    assert result.ok and result.returncodes == [0, 0]
    got = sorted(text for _, text in result.lines if text.startswith("RESULT"))
    assert got == ["RESULT 0 0 0 2 [3.0, 3.0]", "RESULT 1 0 1 2 [3.0, 3.0]"]
    by_node = {n: text for n, text in result.lines if text.startswith("RESULT")}
    assert by_node[0].split()[3] == "0" and by_node[1].split()[3] == "1", "node i must print GROUP_RANK i"
    printed = capsys.readouterr().out
    assert "[node 0] RESULT 0 0 0 2" in printed and "[node 1] RESULT 1 0 1 2" in printed
    assert not processes_of(result.run_id), "a process of the finished run is still alive"


ONE_NODE_FAILS = textwrap.dedent(
    """
    import os, sys
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    dist.barrier()
    dist.destroy_process_group()
    if os.environ["RANK"] == "1":
        os._exit(3)  # node 1's worker fails after the work; node 0's agent then waits at torchrun's exit barrier
    """
)


@pytest.mark.timeout(240)
def test_a_failed_node_stops_the_run_instead_of_leaving_the_others_waiting(tmp_path):
    """Without the harness stopping them, node 0's agent waits at torchrun's exit barrier (5 minutes by default)
    for node 1's agent, which has given up: the run would end only at its timeout, as a TorchrunTimeout."""
    script = _script(tmp_path, "one_fails.py", ONE_NODE_FAILS)
    result = run_nodes(script, nnodes=2, nproc_per_node=1, rdzv="static", timeout=200, check=False, quiet=True)
    assert not result.ok and result.returncodes[1] not in (0, None), result.returncodes
    assert "the agent of node 1 exited with code" in result.output(), result.output()[-2000:]
    assert not processes_of(result.run_id), "a process of the stopped run is still alive"


@pytest.mark.timeout(90)  # the run's own limit is 2 s: a run that ignored it would sleep for 600
def test_timeout_kills_agents_even_before_their_workers_start(tmp_path):
    folder = tmp_path / "pids"
    folder.mkdir()
    script = _script(tmp_path, "sleeper.py", SLEEPER)
    with pytest.raises(TorchrunTimeout) as info:
        run_nodes(script, str(folder), nnodes=2, timeout=2, quiet=True)
    assert not processes_of(info.value.result.run_id), "agents survived a timeout"


KERNEL = textwrap.dedent(
    """
    import signal
    import sys
    from lab_utils.labkit.torchrun import run_nodes
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as ipykernel does, even if started with SIGINT ignored
    try:
        run_nodes(sys.argv[1], sys.argv[2], nnodes=2, nproc_per_node=1, timeout=600, quiet=True)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    """
)


def _start_kernel(tmp_path):
    """A process standing in for a Jupyter kernel whose cell runs two sleeping nodes."""
    folder = tmp_path / "pids"
    folder.mkdir()
    script = _script(tmp_path, "sleeper.py", SLEEPER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", KERNEL, script, str(folder)], env=env,
                            stdout=subprocess.PIPE, text=True)
    workers = _wait_for_pids(folder, 2, proc)
    everyone = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    assert set(workers) <= set(everyone), "workers should descend from the kernel's agents"
    return proc, workers, everyone


def test_kernel_interrupt_reaps_agents_and_workers(tmp_path):
    proc, workers, everyone = _start_kernel(tmp_path)
    proc.send_signal(signal.SIGINT)  # what "Interrupt the kernel" does
    out, _ = proc.communicate(timeout=60)
    assert "interrupted" in out, "the KeyboardInterrupt must reach the cell after the cleanup"
    assert not wait_gone(everyone, timeout=10), "agents or workers survived a kernel interrupt"


def test_kernel_death_takes_agents_and_workers_along(tmp_path):
    proc, workers, everyone = _start_kernel(tmp_path)
    proc.kill()  # a crashed kernel cleans nothing up: the agents' parent-death signal must do it
    proc.wait(timeout=10)
    alive = wait_gone(everyone, timeout=30)
    for pid in alive:  # do not leave them to the next test
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
    assert not alive, f"orphans after the kernel was SIGKILLed: {alive}"
    # The harness was SIGKILLed: its run folder goes through the agents' own cleanup, which an agent killed in turn
    # skips (seen once in a loaded make test); then the next run's start removes it, as here
    nodes.remove_stale_log_folders()


def _listener_where_ranks_listen():
    """A process of this user listening in the network the run's agents use (the ranks' own where the zygote has one,
    ``lab_utils.netns``; else the machine's): (the process, its port)."""
    from lab_utils import netns
    from lab_utils.launcher import zygote

    z = zygote.get_zygote()
    z.ready.wait(120)
    env = dict(os.environ)
    if z.network == netns.PRIVATE:
        env[netns.JOIN_VAR] = str(z.proc.pid)
    proc = subprocess.Popen([sys.executable, "-c", LISTENER], stdout=subprocess.PIPE, text=True, env=env,
                            preexec_fn=netns.preexec(env))
    return proc, int(proc.stdout.readline())


def test_a_taken_port_is_retried_on_another(tmp_path, monkeypatch):
    busy, taken = _listener_where_ranks_listen()
    ports = iter([taken])
    real = nodes.free_port
    monkeypatch.setattr(nodes, "free_port", lambda: next(ports, None) or real())
    script = _script(tmp_path, "all_reduce.py", ALL_REDUCE)
    try:
        result = run_nodes(script, nnodes=2, timeout=120, quiet=True)
    finally:
        busy.kill()
        busy.wait()
    assert result.ok and result.port != taken, "the run should have moved to a free port"
    assert len([t for _, t in result.lines if t.startswith("RESULT")]) == 2


LISTENER = "import socket, time; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); " \
           "print(s.getsockname()[1], flush=True); time.sleep(120)"


def _listener(env):
    proc = subprocess.Popen([sys.executable, "-c", LISTENER], stdout=subprocess.PIPE, text=True, env=env)
    return proc, int(proc.stdout.readline())


def test_a_port_is_taken_only_by_a_process_that_is_not_of_the_run(monkeypatch):
    """The run's marker makes a listener ours before any scan of the agents' children found it; an owner psutil
    could not name (a socket opened while it scanned /proc) is looked at again instead of failing the attempt."""
    run_id = "owners" + os.urandom(4).hex()
    ours, our_port = _listener({**os.environ, reaping.MARKER: run_id})
    other, other_port = _listener(dict(os.environ))
    try:
        assert reaping.port_owners(our_port, [], [], run_id) == ({ours.pid}, set())
        assert reaping.port_owners(other_port, [], [], run_id) == ({other.pid}, {other.pid})
        looks = iter([{None}, {ours.pid}])
        monkeypatch.setattr(reaping, "_listeners", lambda port, network=None: next(looks))
        assert reaping.port_owners(our_port, [], [], run_id) == ({ours.pid}, set()), "a nameless owner is looked at twice"
        monkeypatch.setattr(reaping, "_listeners", lambda port, network=None: {None})
        assert reaping.port_owners(our_port, [], [], run_id)[1] == {None}, "still nameless: another user's process"
    finally:
        for proc in (ours, other):
            proc.kill()
            proc.wait()


SPAWNER = textwrap.dedent(
    """
    import os, subprocess, sys, time
    while True:  # like an agent starting workers, each in its own session, until it is killed
        subprocess.Popen(["sleep", "120"], start_new_session=True)
        time.sleep(0.002)
    """
)


@pytest.mark.parametrize("reaper", ["torchrun", "token"])
def test_reaping_catches_workers_started_while_it_ran(reaper):
    """An agent killed mid-spawn leaves workers that no scan before the kill saw: the marker finds them after (the
    harness's reaping of a run, and the token reaping grading and the tests use)."""
    from lab_utils import processes

    for _ in range(2):
        run_id = "reap" + os.urandom(4).hex()
        agent = subprocess.Popen([sys.executable, "-c", SPAWNER], env={**os.environ, reaping.MARKER: run_id},
                                 start_new_session=True)
        deadline = time.monotonic() + 30
        while len(processes_of(run_id)) < 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        if reaper == "torchrun":
            reaping.reap([agent], [], run_id)
        else:
            processes.reap_token(run_id, reaping.MARKER)
            agent.wait(timeout=10)
        assert agent.poll() is not None and processes_of(run_id) == [], "a worker outlived the reaping"


def test_a_written_script_imports_without_the_collector_and_exits_without_interpreter_teardown(tmp_path):
    """write_script runs the header's imports with the cyclic collector off (a __future__ import stays first) and main
    with it on, and ends main with a flushed hard exit (torch's threads can abort teardown, which torchrun counts as
    a failed worker); output still arrives and an exception in main still fails the script."""
    from lab_utils.labkit.torchrun import write_script

    def greet(name):
        print("hello", name)

    header = "from __future__ import annotations\nimport gc\nimport sys\nprint('collecting', gc.isenabled())"
    ok = write_script(tmp_path / "ok.py", greet, main="greet(sys.argv[1]); print('collecting', gc.isenabled())",
                      header=header)
    assert "_os._exit(0)" in open(ok).read()
    run = subprocess.run([sys.executable, ok, "ranks"], capture_output=True, text=True, timeout=60)
    # the header imports with the collector off (torch's import: a third of its CPU), main runs with it on
    assert run.returncode == 0 and run.stdout == "collecting False\nhello ranks\ncollecting True\n", run
    bad = write_script(tmp_path / "bad.py", greet, main="greet(undefined_name)", header="import sys")
    run = subprocess.run([sys.executable, bad], capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and "NameError" in run.stderr, run


def test_agent_command_for_real_machines():
    static = tr.agent_command("train.py", ("--lr", 0.1), nnodes=2, nproc_per_node=8, node_rank=1,
                              master_addr="node-a", port=29500)
    assert static[1:3] == ["-m", "torch.distributed.run"]
    assert "--node-rank=1" in static and "--master-addr=node-a" in static and static[-3:] == ["train.py", "--lr", "0.1"]
    c10d = tr.agent_command("train.py", nnodes=2, rdzv="c10d", master_addr="node-a", port=29500, run_id="job7")
    assert "--rdzv-endpoint=node-a:29500" in c10d and "--rdzv-id=job7" in c10d
    assert not any(a.startswith("--rdzv-conf") for a in c10d), "the command for real machines stays plain"
    joiner = tr.agent_command("train.py", rdzv="c10d", rdzv_conf={"is_host": "false"})
    assert "--rdzv-conf=is_host=false" in joiner
    assert not any(a.startswith("--node-rank") for a in c10d), "c10d hands out node ranks itself"
    with pytest.raises(ValueError):
        tr.agent_command("train.py", rdzv="etcd")


def test_c10d_agents_join_the_store_this_process_hosts(tmp_path):
    """No agent may host the rendezvous store, or its exit strands the others (``Failed to recv``)."""
    script = _script(tmp_path, "all_reduce.py", ALL_REDUCE)
    result = run_nodes(script, nnodes=2, rdzv="c10d", timeout=120, quiet=True)
    assert result.ok, result.output()
    for cmd in result.commands:
        assert "--rdzv-conf=is_host=false" in cmd and f"--rdzv-endpoint=127.0.0.1:{result.port}" in cmd, cmd
    sums = [t for _, t in result.lines if t.startswith("RESULT")]
    assert len(sums) == 2 and all(t.endswith("[3.0, 3.0]") for t in sums), sums
    from lab_utils.launcher import zygote

    z = zygote.get_zygote()  # the store lived in the ranks' network (the zygote's) and is gone with the run
    network = z.proc.pid if os.readlink(f"/proc/{z.proc.pid}/ns/net") != os.readlink("/proc/self/ns/net") else None
    deadline = time.monotonic() + 10
    while reaping._listeners(result.port, network) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not reaping._listeners(result.port, network), "the run's store still listens after the run"


@pytest.mark.timeout(120)  # each wait below may last HOST_WAIT_S (600 s here) if it waits for the wrong thing
def test_static_host_agent_waits_until_the_others_are_gone(monkeypatch):
    """The static store lives in node 0's agent: it leaves only once the harness saw every other agent exit."""
    import threading
    from datetime import timedelta

    from torch.distributed import TCPStore

    monkeypatch.setattr(agent, "HOST_WAIT_S", 600.0)
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    gone = threading.Event()

    def others_exit(s=store):
        gone.set()
        s.add(nodes.EXITED_KEY, 2)

    threading.Timer(1.0, others_exit).start()
    agent._wait_for_other_agents(f"127.0.0.1:{store.port}:2")
    assert gone.is_set(), "the host agent left before the harness saw the other agents exit"
    agent._wait_for_other_agents(f"127.0.0.1:{store.port}:1")  # already gone: returns (else the test times out)
    del store
    agent._wait_for_other_agents("127.0.0.1:1:1")  # no harness to ask: gives up (else the test times out)


ELASTIC = textwrap.dedent(
    """
    import os, sys, time
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    folder = sys.argv[1]
    ckpt = os.path.join(folder, "step")
    start = int(open(ckpt).read()) if os.path.exists(ckpt) else 0
    print(f"WORLD {world} RANK {rank} FROM {start}", flush=True)

    def first(name):
        try:
            os.close(os.open(os.path.join(folder, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            return True
        except FileExistsError:
            return False

    for step in range(start, 6):
        t = torch.ones(1)
        dist.all_reduce(t)
        if rank == 0:
            open(ckpt + ".tmp", "w").write(str(step + 1))
            os.replace(ckpt + ".tmp", ckpt)
        if step + 1 == 2 and world == 2 and rank == 1 and first("left"):
            print("LEAVE_NOW", flush=True)
            time.sleep(120)
        if step + 1 == 4 and world == 1 and first("joined"):
            print("JOIN_NOW", flush=True)
            time.sleep(120)
    print(f"DONE WORLD {world} RANK {rank}", flush=True)
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)
    """
)


def test_elastic_agent_command_spans_min_to_max():
    cmd = tr.agent_command("train.py", nnodes=4, rdzv="c10d", min_nodes=2)
    assert "--nnodes=2:4" in cmd
    with pytest.raises(ValueError):
        tr.agent_command("train.py", nnodes=4, rdzv="static", min_nodes=2)
    with pytest.raises(ValueError):
        tr.agent_command("train.py", nnodes=2, rdzv="c10d", min_nodes=3)


def test_elastic_events_are_checked(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("print('hi')\n")
    with pytest.raises(ValueError):
        run_nodes(str(script), events={"X": "explode"}, rdzv="c10d")
    with pytest.raises(ValueError):
        run_nodes(str(script), events={"X": "leave"}, rdzv="static")


def test_restarts_need_c10d(tmp_path):
    """A static rendezvous reuses its store across attempts: restarted gloo workers read stale peer addresses (with
    cold workers on this machine, every time). The harness says so before it starts anything."""
    script = tmp_path / "s.py"
    script.write_text("print('hi')\n")
    with pytest.raises(ValueError, match="rdzv='c10d'"):
        run_nodes(str(script), rdzv="static", max_restarts=1)
    with pytest.raises(ValueError, match="rdzv='c10d'"):
        run_nodes(str(script), nnodes=1, nproc_per_node=2, max_restarts=1)


FAILS_ONCE = textwrap.dedent(
    """
    import os, torch, torch.distributed as dist
    dist.init_process_group("gloo")
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    t = torch.ones(1) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    print(f"RANK {dist.get_rank()} ATTEMPT {attempt} SUM {t.item():g}", flush=True)
    if attempt == 0:
        raise SystemExit(3)
    dist.destroy_process_group()
    """
)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_cold_workers_restart_on_c10d(tmp_path, monkeypatch):
    """Every rank fails its first attempt; torchrun restarts them all, started cold (c.DTLabs.warm_torchrun off), and
    the second attempt's all-reduce is right: the restart the static rendezvous could not do."""
    monkeypatch.setenv("DTLABS_WARM_TORCHRUN", "0")
    script = tmp_path / "fails_once.py"
    script.write_text(FAILS_ONCE)
    result = run_nodes(str(script), nnodes=2, rdzv="c10d", max_restarts=1, timeout=150, quiet=True)
    text = "\n".join(t for _, t in result.lines)
    assert result.ok and "RANK 0 ATTEMPT 1 SUM 3" in text and "RANK 1 ATTEMPT 1 SUM 3" in text, text[-3000:]


@pytest.mark.timeout(240)
def test_a_node_leaves_and_another_joins_an_elastic_job(tmp_path):
    script = tmp_path / "elastic.py"
    script.write_text(ELASTIC)
    result = run_nodes(str(script), str(tmp_path), nnodes=2, rdzv="c10d", min_nodes=1, max_restarts=3, timeout=150,
                       rdzv_conf={"last_call_timeout": 1, "keep_alive_interval": 1, "keep_alive_max_heartbeats": 2},
                       events={"LEAVE_NOW": "leave", "JOIN_NOW": "join"}, quiet=True)
    assert result.ok, result.output()
    assert [(e[2], e[3]) for e in result.events] == [("leave", 1), ("join", 2)]
    assert result.left == [1] and len(result.returncodes) == 3
    out = result.output()
    assert "WORLD 1 RANK 0 FROM 2" in out and "WORLD 2 RANK 0 FROM 4" in out and "DONE WORLD 2 RANK 0" in out, out
    assert processes_of(result.run_id) == []


def test_first_failure_picks_the_first_traceback_of_its_node():
    """A quiet run prints nothing, so its TorchrunError carries the first failure itself (Lab 09's elastic demo)."""
    from lab_utils.labkit.torchrun import first_failure

    lines = [(0, "ELASTIC rank 0 resumes at step 0"), (1, "Traceback (most recent call last):"), (0, "noise"),
             (1, '  File "elastic.py", line 3, in train_elastic'), (1, "NameError: name 'w' is not defined"),
             (0, "Traceback (most recent call last):")]
    text = first_failure(lines)
    assert text.splitlines() == ["[node 1] Traceback (most recent call last):",
                                 '[node 1]   File "elastic.py", line 3, in train_elastic',
                                 "[node 1] NameError: name 'w' is not defined"]
    assert first_failure([(0, "a"), (1, "b")]) == "[node 0] a\n[node 1] b"
    assert first_failure([]) == "(the agents printed nothing)"
