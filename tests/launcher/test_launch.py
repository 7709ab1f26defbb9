"""lab_utils.launcher.launch: results, environment, output streaming, failures and bad input (CPU, gloo)."""
from __future__ import annotations

import importlib
import os
import re
import threading
import time

import psutil
import pytest
import torch

from helpers import launch as h
from lab_utils import RankFailedError, RankTimeoutError, cgroups, launch
from lab_utils.launcher.backend import choose_backend


@pytest.fixture(autouse=True)
def no_rank_left_behind():
    """Every test in this module must leave no rank process of this test process alive."""
    yield
    me = psutil.Process()
    leftover = []
    for p in me.children(recursive=True):
        try:
            if p.name().startswith("dtlabs-rank"):
                leftover.append(p.pid)
        except psutil.NoSuchProcess:  # exited between listing and naming: gone, which is what we want
            pass
    assert not h.wait_gone(leftover, timeout=5), f"rank processes survived the launch: {leftover}"


def test_results_come_back_in_rank_order():
    out = launch(h.all_reduce_rank_plus_one, world_size=2, quiet=True)
    assert [t.tolist() for t in out] == [[3.0] * 4, [3.0] * 4]
    assert launch(h.returns_own_rank, world_size=4, quiet=True) == [0, 1, 2, 3]


def test_args_and_kwargs_reach_every_rank():
    out = launch(h.all_reduce_rank_plus_one, world_size=3, args=(2,), quiet=True)
    assert [t.tolist() for t in out] == [[6.0, 6.0]] * 3
    out = launch(h.all_reduce_rank_plus_one, world_size=1, kwargs={"n": 1}, quiet=True)
    assert out[0].tolist() == [1.0]


def test_ranks_see_torchrun_environment_and_split_the_cores():
    envs = launch(h.report_env, world_size=2, quiet=True)
    ports = {e["MASTER_PORT"] for e in envs}
    assert len(ports) == 1 and ports != {None}
    for rank, env in enumerate(envs):
        assert env["RANK"] == env["LOCAL_RANK"] == str(rank) == str(env["dist_rank"])
        assert env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == "2" and env["dist_world"] == 2
        assert env["MASTER_ADDR"] == "127.0.0.1"
        assert env["backend"] == choose_backend(2, "auto").backend  # what this machine's launch chooses
        cpus = cgroups.cpu_budget().cpus  # the cgroup's quota, the cpuset and the affinity mask
        assert env["threads"] == max(1, cpus // 2) == int(env["OMP_NUM_THREADS"])
    assert envs[0]["pid"] != envs[1]["pid"] != os.getpid()


def test_each_launch_gets_fresh_processes():
    a = launch(h.report_env, world_size=2, quiet=True)
    b = launch(h.report_env, world_size=2, quiet=True)
    assert {e["pid"] for e in a}.isdisjoint({e["pid"] for e in b})


def test_a_rank_never_collects_the_objects_it_was_forked_with():
    """The zygote freezes its objects (torch's, imported once) before each fork: a rank's full collections would
    otherwise walk them all and, by writing to each, copy every page they sit on (10 launches of a rank making 200,000
    small objects: 13.9 CPU-s without, 3.5 with)."""
    ranks = launch(h.frozen_objects, world_size=2, quiet=True)
    frozen = [n for n, _ in ranks]
    assert min(frozen) > 10_000, f"objects frozen in each rank: {frozen} (none: the zygote forked without gc.freeze)"
    assert all(on for _, on in ranks), "a rank runs without the garbage collector (the zygote's is off: turn it on)"


def test_output_is_prefixed_with_the_rank(capsys):
    launch(h.say_hello, world_size=2, quiet=True)
    out, err = capsys.readouterr()
    assert "[rank 0] hello from rank 0" in out and "[rank 1] hello from rank 1" in out
    assert "[rank 1] warning on stderr from rank 1" in err


def test_backend_choice_is_announced_once(capsys):
    L = importlib.import_module("lab_utils.launcher.launch")

    L._banner_seen.clear()
    launch(h.returns_own_rank, world_size=2)
    launch(h.returns_own_rank, world_size=2)
    out, _ = capsys.readouterr()
    assert out.count(f"[launch] 2 ranks, {choose_backend(2, 'auto').reason}") == 1


def test_launcher_never_initialises_cuda_here():
    launch(h.returns_own_rank, world_size=2, quiet=True)
    assert not torch.cuda.is_initialized()


@pytest.mark.timeout(50)  # under the launch's own 60 s: rank 0 must be stopped, not waited for
def test_a_rank_that_raises_stops_the_others_and_names_itself():
    with pytest.raises(RankFailedError) as info:
        launch(h.rank1_raises, world_size=2, timeout=60, quiet=True)
    err = info.value
    assert err.rank == 1 and err.exc_type == "ValueError"
    assert isinstance(err.exception, ValueError)
    msg = str(err)
    assert msg.startswith("rank 1 raised ValueError: rank one is unhappy")
    assert 'raise ValueError("rank one is unhappy")' in msg  # the remote line, source filled in
    assert "helpers/launch.py" in msg and "_worker.py" not in msg  # launcher frames hidden


def test_a_rank_killed_by_a_signal_is_the_root_cause_not_its_peer():
    with pytest.raises(RankFailedError) as info:
        launch(h.rank1_killed, world_size=2, timeout=60, quiet=True)
    assert info.value.rank == 1
    assert "rank 1 was killed by SIGKILL" in str(info.value)


@pytest.mark.timeout(60)  # the launch times out after 10 s; its report must follow promptly
def test_a_deadlocked_rank_is_named_with_its_stack():
    t0 = time.monotonic()
    with pytest.raises(RankTimeoutError) as info:
        launch(h.rank1_skips_all_reduce, world_size=2, timeout=10, quiet=True)
    elapsed = time.monotonic() - t0
    assert elapsed >= 10, f"reported after {elapsed:.1f} s, before the 10 s timeout"  # a lower bound holds under load
    err = info.value
    assert err.stuck_ranks == [0]
    msg = str(err)
    assert "1 of 2 ranks did not finish within 10 s (rank(s) [1] had already returned)" in msg
    assert "rank 0 is waiting in all_reduce at" in msg
    assert "dist.all_reduce(t)  # rank 1 never joins" in msg  # the student's line, from its stack
    assert "Stack of rank 0" in msg and "helpers/launch.py" in err.stacks[0]


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        ({"world_size": 0}, ValueError, "world_size=0 is out of range"),
        ({"world_size": 10_000}, ValueError, "world_size=10000 is out of range"),
        ({"world_size": "2"}, TypeError, "world_size must be an int"),
        ({"world_size": 2, "backend": "mpi"}, ValueError, "backend='mpi' is not one of"),
        ({"world_size": 2, "timeout": 0}, ValueError, "timeout must be a positive number"),
    ],
)
def test_bad_arguments_fail_before_anything_starts(kwargs, error, words):
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(error, match=words):
        launch(h.returns_own_rank, quiet=True, **kwargs)
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before


@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="this machine has GPUs for NCCL")
def test_nccl_without_gpus_is_a_clear_error():
    with pytest.raises(ValueError, match="backend='nccl' needs one CUDA GPU per rank"):
        launch(h.returns_own_rank, world_size=2, backend="nccl", quiet=True)


def test_an_unpicklable_function_is_a_clear_error():
    lock = threading.Lock()

    def uses_a_lock():
        with lock:
            return 1

    with pytest.raises(TypeError, match=r"cannot send uses_a_lock\(\) and its arguments to the ranks"):
        launch(uses_a_lock, world_size=2, quiet=True)


def test_not_a_function_is_a_clear_error():
    with pytest.raises(TypeError, match="needs a function"):
        launch(42, world_size=2)


def test_debug_mode_turns_on_collective_checks():
    def level():
        import torch.distributed as dist

        return str(dist.get_debug_level())

    assert launch(level, world_size=2, debug=True, quiet=True) == ["DebugLevel.DETAIL"] * 2


# ---------------------------------------------------------------------------------------------- GPU path
@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs for a 2-rank NCCL group")
def test_auto_picks_nccl_with_one_gpu_per_rank():
    def where():
        import torch
        import torch.distributed as dist

        t = torch.ones(2, device="cuda") * (dist.get_rank() + 1)
        dist.all_reduce(t)
        return dist.get_backend(), torch.cuda.current_device(), t

    before = torch.cuda.is_initialized()  # another test in this process may have used CUDA; launch() must not
    out = launch(where, world_size=2, quiet=True)
    assert [o[0] for o in out] == ["nccl", "nccl"]
    assert [o[1] for o in out] == [0, 1]
    assert all(o[2].device.type == "cpu" and o[2].tolist() == [3.0, 3.0] for o in out)
    assert torch.cuda.is_initialized() == before


def _cuda_seen():
    import os

    import torch

    return os.environ.get("CUDA_VISIBLE_DEVICES"), torch.cuda.is_available()


def test_cpu_ranks_see_no_gpu():
    """gloo and relay ranks are CPU ranks: torch code that asks for CUDA (FSDP2's default mesh, PowerSGD) stays on
    the CPU instead of picking a device per LOCAL_RANK that may not exist."""
    assert launch(_cuda_seen, world_size=2, backend="gloo", quiet=True) == [("", False)] * 2


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 1, reason="needs a CUDA GPU")
def test_nccl_at_world_size_equal_to_the_gpu_count():
    n = torch.cuda.device_count()
    assert choose_backend(n).backend == "nccl"
    before = torch.cuda.is_initialized()  # another test in this process may have used CUDA; launch() must not
    out = launch(h.all_reduce_rank_plus_one, world_size=n, quiet=True)
    assert [t.tolist() for t in out] == [[float(n * (n + 1) // 2)] * 4] * n
    assert torch.cuda.is_initialized() == before


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() != 1, reason="needs exactly 1 CUDA GPU")
def test_auto_falls_back_to_gloo_with_too_few_gpus(capsys):
    L = importlib.import_module("lab_utils.launcher.launch")

    L._banner_seen.clear()
    assert launch(h.report_env, world_size=2)[0]["backend"] == "gloo"
    assert "too few for NCCL" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------ failures that teach
@pytest.mark.parametrize("reader", ["prompt", "late"])
def test_a_gloo_size_mismatch_names_the_call_and_the_sizes_without_a_dump(reader, capsys, monkeypatch):
    """A ring with its neighbours swapped, on 3 ranks: gloo aborts the process from a C++ thread. ``late``: the
    launcher reads the ranks' stderr slowly, as on a loaded machine, so the aborted rank's exit status arrives
    before its last words; the error must still be built from them."""
    if reader == "late":
        from lab_utils import processes

        real = processes.pump_lines

        def late_lines(fd, on_line, on_eof=None):
            def late(text):
                time.sleep(0.02)
                on_line(text)
            return real(fd, late, on_eof)

        monkeypatch.setattr(processes, "pump_lines", late_lines)

    def swapped_ring():
        import torch
        import torch.distributed as dist

        rank, world = dist.get_rank(), dist.get_world_size()
        right, left = (rank - 1) % world, (rank + 1) % world  # swapped
        chunks = torch.tensor_split(torch.ones(7), world)  # 3, 2, 2 elements: 12, 8, 8 bytes
        incoming = torch.empty_like(chunks[0])[: chunks[(rank - 1) % world].numel()]
        request = dist.isend(chunks[rank], right)
        dist.recv(incoming, left)  # the line the message must show
        request.wait()
        return 0

    with pytest.raises(RankFailedError) as info:
        launch(swapped_ring, world_size=3, timeout=60, quiet=True)
    msg = str(info.value)
    assert "torch.distributed.recv" in msg
    assert "bytes arrived where the receiving tensor holds" in msg
    assert "dist.recv(incoming, left)  # the line the message must show" in msg
    assert "(r + 1) % N" in msg  # the tutor's hint
    out, err = capsys.readouterr()
    for noise in ("Thread 0x", "Extension modules", "terminate called", "enforce fail at", "_worker.py"):
        assert noise not in msg, f"{noise!r} in the error message:\n{msg}"
        assert noise not in err, f"{noise!r} streamed into the cell:\n{err}"


def test_crash_digest_names_notebook_cells_not_temp_files(monkeypatch):
    import builtins
    import types

    cell = "/tmp/ipykernel_4242/123456.py"
    fake = types.SimpleNamespace(compile=types.SimpleNamespace(_filename_map={cell: 12}))
    monkeypatch.setattr(builtins, "get_ipython", lambda: fake, raising=False)
    dump = [
        "terminate called after throwing an instance of 'gloo::EnforceNotMet'",
        "  what():  [enforce fail at /__w/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:456] "
        "op.preamble.length <= op.nbytes. 12 vs 8. Received data size doesn't match expected size. "
        "Is there a distributed collective mismatch in your code?",
        "Fatal Python error: Aborted",
        "",
        "Thread 0x00007f01378146c0 (most recent call first):",
        '  File "/x/lab_utils/launcher/worker.py", line 78 in loop',
        "",
        "Thread 0x00007f015724fb80 (most recent call first):",
        '  File "/x/site-packages/torch/distributed/distributed_c10d.py", line 2799 in recv',
        '  File "/x/site-packages/torch/distributed/c10d_logger.py", line 83 in wrapper',
        f'  File "{cell}", line 14 in ring_all_reduce',
        '  File "/x/lab_utils/launcher/worker.py", line 250 in _call_in_group',
        "",
        "Extension modules: numpy, torch._C (total: 2)",
    ]
    D = importlib.import_module("lab_utils.launcher.diagnostics")
    S = importlib.import_module("lab_utils.launcher.events")
    digest = D.crash_digest(dump)
    assert digest["op"] == "recv" and digest["fatal"] == "Aborted"
    assert digest["stack"].startswith("  Cell In[12], line 14, in ring_all_reduce")
    rk = S.Rank(rank=0, job_w=-1, out_r=-1, err_r=-1, result_r=-1, state=S.RankState.EXITED, exit_code=-6,
                stderr_tail=dump)
    peer = S.Rank(rank=1, job_w=-1, out_r=-1, err_r=-1, result_r=-1, state=S.RankState.RUNNING)
    msg = str(D.failure_error([rk, peer]))
    assert msg.startswith("rank 0 was killed by SIGABRT (rank 1 stopped).")
    assert "torch.distributed.recv: a message of 12 bytes arrived where the receiving tensor holds 8 bytes" in msg
    assert "Cell In[12], line 14, in ring_all_reduce" in msg
    for noise in ("/tmp/ipykernel", "Thread 0x", "enforce fail", "Extension modules", "pair.cc"):
        assert noise not in msg, msg


@pytest.mark.parametrize(
    "torch_message, words",
    [
        ("Detected mismatch between collectives on ranks. Rank 0 is running collective: CollectiveFingerPrint("
         "SequenceNumber=3OpType=ALLREDUCE), but Rank 1 is running collective: CollectiveFingerPrint(SequenceNumber=3"
         "OpType=REDUCE).Collectives differ in the following aspects: \t Op type: ALLREDUCEvs REDUCE",
         ["rank 0 called all_reduce (its collective #4)", "rank 1 called reduce", "op type: all_reduce vs reduce"]),
        ("Detected mismatch between collectives on ranks. Rank 1 is running collective: CollectiveFingerPrint("
         "SequenceNumber=0, OpType=ALLREDUCE, TensorShape=[4], TensorDtypes=Float, TensorDeviceTypes=TensorOptions("
         "dtype=float (default), device=cpu)), but Rank 0 is running collective: CollectiveFingerPrint(SequenceNumber=0, "
         "OpType=ALLREDUCE, TensorShape=[3], TensorDtypes=Float, TensorDeviceTypes=TensorOptions(dtype=float (default), "
         "device=cpu)).Collectives differ in the following aspects: \t Tensor Tensor shapes: 4vs 3",
         ["rank 1 called all_reduce (its collective #1) on a tensor of shape [4], dtype float",
          "shape [3]", "tensor shapes: 4 vs 3"]),
    ],
)
def test_debug_mismatch_messages_read_cleanly(torch_message, words):
    D = importlib.import_module("lab_utils.launcher.diagnostics")
    text = D.clean_message(torch_message)
    for w in words:
        assert w in text, text
    assert not re.search(r"\Svs ", text) and "ALLREDUCE" not in text and "CollectiveFingerPrint" not in text, text


def test_debug_mode_names_mismatched_collectives_cleanly():
    def mismatched():
        import torch
        import torch.distributed as dist

        t = torch.ones(2)
        if dist.get_rank() == 0:
            dist.all_reduce(t)
        else:
            dist.reduce(t, dst=0)
        return 0

    with pytest.raises(RankFailedError) as info:
        launch(mismatched, world_size=2, timeout=60, debug=True, quiet=True)
    msg = str(info.value)
    assert "collective mismatch" in msg and "all_reduce" in msg and " reduce" in msg, msg
    assert not re.search(r"\Svs ", msg) and "ALLREDUCE" not in msg and "CollectiveFingerPrint" not in msg, msg


def test_a_segfault_is_summarised_with_the_line_not_dumped(capsys):
    def rank1_segfaults():
        import os
        import signal

        import torch.distributed as dist

        if dist.get_rank() == 1:
            os.kill(os.getpid(), signal.SIGSEGV)  # stands in for a crash in C++ code
        return 0

    with pytest.raises(RankFailedError) as info:
        launch(rank1_segfaults, world_size=2, timeout=60, quiet=True)
    msg = str(info.value)
    assert info.value.rank == 1 and "Segmentation fault" in msg, msg
    assert "os.kill(os.getpid(), signal.SIGSEGV)" in msg, msg
    _, err = capsys.readouterr()
    assert "Thread 0x" not in msg and "Thread 0x" not in err and "Fatal Python error" not in err, (msg, err)


def test_fork_zygote_refuses_a_threaded_process():
    """A fork copies one thread and every lock: only a single-threaded process (the subject at start-up) may."""
    from lab_utils.launcher.zygote import fork_zygote

    release = threading.Event()
    worker = threading.Thread(target=release.wait)
    worker.start()
    try:
        with pytest.raises(RuntimeError, match="single-threaded"):
            fork_zygote()
    finally:
        release.set()
        worker.join()

