"""The zygote (a warm fork server) and the rank processes it forks.

Why a zygote: a fresh interpreter per rank pays ``import torch`` (2-3 s) on every launch, and forking the
notebook itself is unsafe once CUDA or threads are live (pytorch#20375, accelerate#940). The zygote is
started once per notebook with ``python -m lab_utils._worker``: it imports torch (never CUDA), stays
single-threaded, and forks a clean rank process per rank per launch in about a millisecond. Ranks are
used once and exit; the zygote is never touched by student code.

Protocol (one Unix socket to the launcher, JSON frames, see ``_wire``):
  launcher -> zygote  {"op": "fork", "rank": k}  + fds [job_r, out_w, err_w, result_w]
  zygote -> launcher  {"op": "forked", "rank": k, "pid": p}
  zygote -> launcher  {"op": "exit", "pid": p, "status": s}   (waitpid status, signal as -signum)
  zygote -> launcher  {"op": "ready", "modules": [...]}        (torch imported: forks can start)
  zygote -> launcher  {"op": "warm"}                           (every WARM_IMPORTS module imported)
The rank reads one cloudpickled job frame on stdin (fd 0) and writes one result frame on fd 3.
"""
from __future__ import annotations

import os
import select
import signal
import socket
import sys
import threading
import time

from lab_utils import _wire, processes
from lab_utils.supervise import CELL_END

RESULT_FD = 3
RANK_MARK = "DTLABS_RANK_PID"  # in every rank's environment: the programs a rank starts carry its pid

# Imported right away (a cold launch waits for these) ...
CORE_IMPORTS = ["torch", "torch.distributed", "cloudpickle"]
# ... then one at a time while the zygote is idle, so later launches of DDP/FSDP code start warm
# (the first DDP() pulls in torch._dynamo, +2 s; FSDP launches took 11-24 s cold, ARCHITECTURE.md section 2).
WARM_IMPORTS = [
    "torch.nn.parallel",
    "torch.distributed.algorithms.ddp_comm_hooks",
    "torch._dynamo",
    "torch.distributed.fsdp",
    "torch.distributed.optim",
    "torch.distributed.checkpoint",
    "torch.profiler",
    "torch.distributed.device_mesh",  # Lab 07's meshes and tensor parallel: the first DTensor launch is 4 s cold
    "torch.distributed.tensor.parallel",
    "torch.utils.data",
    "torch.optim",
    "numpy",
]


# --------------------------------------------------------------------------------------------- zygote
def zygote_main(sock_fd: int, launcher_pid: int) -> None:
    processes.set_name("dtlabs-zygote")
    # Every process under us stays ours: orphaned rank children (own-session ones included) re-parent to the
    # zygote, which kills them when their rank is gone and kills everything under it before it exits.
    processes.become_subreaper()
    signal.signal(signal.SIGTERM, _exit_with_descendants)
    processes.die_with_parent(launcher_pid, sig=signal.SIGTERM)  # the launcher died: clean up, then exit
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a kernel interrupt is the launcher's to handle
    sock = socket.socket(fileno=sock_fd)
    for name in CORE_IMPORTS:
        __import__(name)
    _wire.send_json(sock, {"op": "ready", "modules": CORE_IMPORTS})
    pending_imports = list(WARM_IMPORTS) if os.environ.get("DTLABS_WARM_IMPORTS", "1") != "0" else []
    if not pending_imports:
        _wire.send_json(sock, {"op": "warm"})
    children: set[int] = set()
    try:
        while True:
            # Reap exited ranks and report their status (the launcher cannot waitpid on our children).
            # Adopted orphans are reaped here too, silently.
            rank_ended = False
            while True:
                try:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
                if pid not in children:
                    continue
                children.discard(pid)
                rank_ended = True
                code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
                _wire.send_json(sock, {"op": "exit", "pid": pid, "status": code})
            if rank_ended:
                _kill_orphans(children)
            if os.getppid() != launcher_pid:
                break
            timeout = 0.0 if pending_imports else 0.05
            readable, _, _ = select.select([sock], [], [], timeout)
            if not readable:
                if pending_imports:
                    name = pending_imports.pop(0)
                    try:
                        __import__(name)
                    except Exception:  # optional extras: absence only costs warm-up time
                        pass
                    if threading.active_count() > 1:  # pragma: no cover - would make fork unsafe
                        print(f"dtlabs-zygote: importing {name} started a thread", file=sys.stderr)
                    if not pending_imports:
                        _wire.send_json(sock, {"op": "warm"})
                continue
            msg, fds = _wire.recv_json(sock, maxfds=4)
            if msg is None:
                break
            if msg.get("op") == "fork":
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    sock.close()
                    _rank_after_fork(msg["rank"], fds, zygote_pid=os.getppid(), launcher_pid=launcher_pid)
                    os._exit(0)  # not reached
                children.add(pid)
                for fd in fds:
                    os.close(fd)
                _wire.send_json(sock, {"op": "forked", "rank": msg["rank"], "pid": pid})
            elif msg.get("op") == "stop":
                break
    finally:
        for pid in children:
            processes.killpg_quiet(pid)
        processes.kill_descendants()


def _exit_with_descendants(signum, frame):
    """SIGTERM (the launcher's death or ``shutdown``): no rank, nor anything a rank started, outlives us."""
    processes.kill_descendants()
    os._exit(0)


def _kill_orphans(live_ranks: set) -> None:
    """Kill the adopted orphans (and their trees) whose rank has ended.

    A rank marks its environment with ``DTLABS_RANK_PID``, so the programs it starts carry its pid; an orphan
    without the mark (a forked-only child that left the rank's session) is killed once no rank is running."""
    import psutil

    try:
        orphans = [p for p in psutil.Process().children() if p.pid not in live_ranks]
    except psutil.Error:
        return
    doomed = []
    for p in orphans:
        try:
            owner = p.environ().get(RANK_MARK)
        except (psutil.Error, OSError):
            owner = None
        if (owner is None and not live_ranks) or (owner is not None and int(owner) not in live_ranks):
            doomed.append(p)
    if doomed:
        processes.kill_procs([q for p in doomed for q in processes.tree(p.pid)], wait_s=0)


# ----------------------------------------------------------------------------------------------- rank
def _rank_after_fork(rank: int, fds: list[int], zygote_pid: int, launcher_pid: int) -> None:
    os.setsid()  # own process group: the launcher kills rank + its children with one killpg
    processes.set_name(f"dtlabs-rank{rank}")
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


def run_rank() -> int:
    """Run one job: read it, join the process group, call fn, send back the result or the error."""
    import faulthandler

    import cloudpickle

    faulthandler.enable(file=sys.stderr, all_threads=True)  # segfaults show a Python stack
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)  # launcher asks on timeout

    frame = _wire.read_frame(0)
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
    _wire.write_frame(RESULT_FD, data)
    # Stay alive (and keep our gloo/NCCL connections open) until the launcher ends the launch, so a rank
    # that returned early cannot turn a peer's missed collective into a misleading "connection closed".
    _wire.read_frame(0)
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
    _wire.write_frame(RESULT_FD, cloudpickle.dumps(("ok", {"ready": True, "pid": os.getpid()})))
    while True:
        frame = _wire.read_frame(0)
        if frame is None:
            return
        req = cloudpickle.loads(frame)
        if req["op"] == "stop":
            return
        try:
            if req["op"] == "exec":
                value = _exec_cell(req["source"], req["filename"], namespace)
            elif req["op"] == "pull":
                from lab_utils import plaindata

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
        _wire.write_frame(RESULT_FD, data)


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


if __name__ == "__main__":
    zygote_main(int(sys.argv[1]), int(sys.argv[2]))
