"""What a rank process runs: one launch's job, or (``%%distributed``) cells until it is told to stop.

A rank is forked by the zygote (``zygote``) and wired to its launcher through four descriptors: the job frames on
fd 0 (cloudpickled), stdout and stderr as line-buffered pipes, and one result frame per job on ``RESULT_FD``. It
joins the process group the launch's ``TCPStore`` rendezvous names, with torchrun's environment, calls the job's
function and sends back ``("ok", value)`` or ``("error", description)``. The rendezvous is hosted on the ranks'
network by another process the zygote forks for the launch (``keep_store``).
"""
from __future__ import annotations

import gc
import os
import signal
import sys
import time

from lab_utils import processes
from lab_utils.launcher import wire
RESULT_FD = 3
RANK_MARK = "DTLABS_RANK_PID"  # in every rank's environment: the programs a rank starts carry its pid (``zygote``)
# A persistent rank ends each cell's output with this on stdout and stderr (``serve_cells``): its result frame
# travels on another pipe and can arrive before the last lines, which would then print in the next cell.
CELL_END = "\x1edtlabs-cell-end"

def rank_after_fork(rank: int, fds: list[int], zygote_pid: int, launcher_pid: int) -> None:
    os.setsid()  # own process group: the launcher kills rank + its children with one killpg
    processes.set_name(f"dtlabs-rank{rank}")
    gc.enable()  # the zygote runs without the collector; a rank runs a student's code
    processes.die_with_parent(zygote_pid, watch_s=0.5)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the zygote's clean-up handler is not ours
    job_r, out_w, err_w, result_w = fds
    os.dup2(job_r, 0)
    os.dup2(out_w, 1)
    os.dup2(err_w, 2)
    os.dup2(result_w, RESULT_FD)
    for fd in set(fds) - {0, 1, 2, RESULT_FD}:
        os.close(fd)
    sys.stdin = open(0, "rb", buffering=0, closefd=False)  # noqa: SIM115
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115  line-buffered: stream live
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    try:
        code = run_rank()
    except BaseException:  # noqa: BLE001 - last resort, the launcher reports it
        import traceback

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def keep_store(listener, hold_r: int, zygote_pid: int) -> None:
    """Host a launch's rendezvous: a ``TCPStore`` on ``listener`` (bound in the ranks' network, where the launcher's
    process cannot listen) until ``hold_r`` reaches its end (the launch closed, or its launcher died). Each line
    read from ``hold_r`` adds 1 to the key it names: how a process outside that network still counts into the
    store (torchrun's harness, the agents that have exited)."""
    from datetime import timedelta

    os.setsid()
    processes.set_name("dtlabs-store")
    processes.die_with_parent(zygote_pid, watch_s=0.5)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    import torch.distributed as dist

    port = listener.getsockname()[1]
    store = dist.TCPStore("127.0.0.1", port, world_size=None, is_master=True, timeout=timedelta(hours=1),
                          wait_for_workers=False, master_listen_fd=listener.detach())
    with os.fdopen(hold_r, "rb", buffering=0) as hold:
        for line in iter(hold.readline, b""):
            if line.strip():
                store.add(line.strip().decode(errors="replace"), 1)
    del store
    os._exit(0)


def run_rank() -> int:
    """Run one job: read it, join the process group, call fn, send back the result or the error."""
    import faulthandler

    import cloudpickle

    faulthandler.enable(file=sys.stderr, all_threads=True)  # segfaults show a Python stack
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)  # launcher asks on timeout

    frame = wire.read_frame(0)
    if frame is None:
        return 0  # launcher went away before sending work
    job = cloudpickle.loads(frame)
    os.environ.clear()
    os.environ.update(job["env"])
    os.environ[RANK_MARK] = str(os.getpid())
    os.chdir(job["cwd"])
    for p in reversed(job["sys_path"]):
        if p not in sys.path:
            sys.path.insert(0, p)

    import torch

    torch.set_num_threads(job["threads"])
    try:
        fn, args, kwargs = cloudpickle.loads(job["payload"])
        result = _call_in_group(job, fn, args, kwargs)
        message = ("ok", result)
        try:
            data = cloudpickle.dumps(message)
        except Exception as exc:  # noqa: BLE001
            raise TypeError(f"rank {job['rank']}: the return value could not be pickled: {exc}") from exc
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the notebook
        data = cloudpickle.dumps(("error", _describe_exception(exc)))
    sys.stdout.flush()
    sys.stderr.flush()
    wire.write_frame(RESULT_FD, data)
    # Stay alive (and keep our gloo/NCCL connections open) until the launcher ends the launch, so a rank
    # that returned early cannot turn a peer's missed collective into a misleading "connection closed".
    wire.read_frame(0)
    return 0


def _call_in_group(job, fn, args, kwargs):
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    if job["debug"]:
        os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
        dist.set_debug_level_from_env()
    device_id = None
    if job["backend"] == "nccl":
        local = job["rank"] % torch.cuda.device_count()
        torch.cuda.set_device(local)
        device_id = torch.device("cuda", local)
    if job.get("relay"):  # launch(..., traffic=...): every message goes through the launcher's relay
        from lab_utils.launcher import relay

        relay.join(job["relay"])
    store = dist.TCPStore(
        job["master_addr"], job["master_port"], is_master=False, timeout=timedelta(seconds=job["store_timeout"])
    )
    init = dict(
        backend=job["backend"],
        store=store,
        rank=job["rank"],
        world_size=job["world_size"],
        timeout=timedelta(seconds=job["pg_timeout"]),
    )
    if device_id is not None:
        init["device_id"] = device_id
    dist.init_process_group(**init)
    result = fn(*args, **kwargs)
    return _to_cpu(result)


def serve_cells() -> None:
    """A persistent rank (the ``%%distributed`` magic): run cells in one namespace until the notebook stops us.

    Each frame on fd 0 is a cloudpickled request; each gets exactly one result frame, as a launch's:
      {"op": "exec", "source": ..., "filename": ...} -> ("ok", {"repr": str|None, "figures": [png bytes]})
      {"op": "pull", "name": ...}                   -> ("ok", plaindata bytes)
    or ("error", exception description). SIGINT is a KeyboardInterrupt in the cell, ignored between cells.
    """
    import cloudpickle
    import torch
    import torch.distributed as dist

    namespace = {"__name__": "__main__", "__builtins__": __builtins__, "torch": torch, "dist": dist,
                 "rank": dist.get_rank(), "world_size": dist.get_world_size()}
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    wire.write_frame(RESULT_FD, cloudpickle.dumps(("ok", {"ready": True, "pid": os.getpid()})))
    while True:
        frame = wire.read_frame(0)
        if frame is None:
            return
        req = cloudpickle.loads(frame)
        if req["op"] == "stop":
            return
        try:
            if req["op"] == "exec":
                value = _exec_cell(req["source"], req["filename"], namespace)
            elif req["op"] == "pull":
                from lab_utils.launcher import plaindata

                if req["name"] not in namespace:
                    raise NameError(f"name {req['name']!r} is not defined on rank {dist.get_rank()}")
                value = plaindata.encode(namespace[req["name"]])
            else:
                raise ValueError(f"unknown request {req['op']!r}")
            data = cloudpickle.dumps(("ok", value))
        except BaseException as exc:  # noqa: BLE001 - everything goes back to the notebook
            data = cloudpickle.dumps(("error", _describe_exception(exc)))
        for stream in (sys.stdout, sys.stderr):  # the notebook waits for these before the cell ends
            stream.write(CELL_END + "\n")
            stream.flush()
        wire.write_frame(RESULT_FD, data)


def _exec_cell(source: str, filename: str, namespace: dict) -> dict:
    """Run a cell like IPython does: statements, then the last expression's value (shown per rank)."""
    import ast
    import linecache

    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    tree = ast.parse(source, filename)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        exec(compile(tree, filename, "exec"), namespace)  # noqa: S102 - the student's own cell, on their rank
        value = eval(compile(last, filename, "eval"), namespace) if last is not None else None  # noqa: S307
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    out = {"repr": None, "figures": []}
    if value is not None:
        namespace["_"] = value
        out["repr"] = repr(value)
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is not None:  # figures the cell drew come back as PNG and are shown in the cell
        import io

        for num in plt.get_fignums():
            buf = io.BytesIO()
            plt.figure(num).savefig(buf, format="png", bbox_inches="tight")
            out["figures"].append(buf.getvalue())
        plt.close("all")
    return out


def _to_cpu(obj):
    """CUDA tensors come back on the CPU, so unpickling them never initialises CUDA in the notebook."""
    import torch
    from torch.utils._pytree import tree_map

    return tree_map(lambda x: x.cpu() if isinstance(x, torch.Tensor) and x.device.type != "cpu" else x, obj)


def _describe_exception(exc: BaseException) -> dict:
    import traceback

    import cloudpickle

    tb = traceback.TracebackException.from_exception(exc)
    frames = [(f.filename, f.lineno, f.name, f.line) for f in tb.stack]
    try:
        pickled = cloudpickle.dumps(exc)
        cloudpickle.loads(pickled)
    except Exception:  # noqa: BLE001 - not every exception survives a round trip
        pickled = None
    return {
        "type": type(exc).__name__,
        "module": type(exc).__module__,
        "message": str(exc),
        "frames": frames,
        "formatted": "".join(tb.format()),
        "time": time.time(),
        "pickled": pickled,
    }
