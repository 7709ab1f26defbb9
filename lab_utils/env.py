"""Which backend and devices a launch gets, decided without initialising CUDA in the notebook.

Initialising CUDA in the notebook process would make every later fork unsafe and pin GPU memory in the
kernel; ``torch.cuda.device_count()`` is NVML-based where possible and leaves CUDA uninitialised.
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass

BACKENDS = ("auto", "gloo", "nccl")
MAX_LOCAL_WORLD_SIZE = 64


def gpu_count() -> int:
    """Visible CUDA devices, without creating a CUDA context here."""
    import torch

    if not torch.cuda.is_available():  # does not initialise CUDA
        return 0
    return torch.cuda.device_count()


def dist_module():
    import torch.distributed as dist

    return dist


def nccl_available() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_nccl_available()


@dataclass(frozen=True)
class BackendChoice:
    backend: str
    reason: str


def choose_backend(world_size: int, backend: str = "auto") -> BackendChoice:
    """NCCL with one GPU per rank when there are enough GPUs, else gloo on CPU; explain the choice."""
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not one of {BACKENDS}: use 'auto' to let the launcher choose")
    gpus = gpu_count()
    if backend == "gloo":
        return BackendChoice("gloo", "gloo on CPU (asked for)")
    enough = gpus >= world_size and nccl_available()
    if backend == "nccl":
        if not enough:
            have = f"{gpus} GPU(s)" if nccl_available() else "no NCCL in this torch build"
            raise ValueError(
                f"backend='nccl' needs one CUDA GPU per rank: {world_size} ranks, found {have}. "
                "Use backend='gloo' (CPU) or backend='auto'."
            )
        return BackendChoice("nccl", f"nccl, one GPU per rank ({gpus} GPUs visible)")
    if enough:
        return BackendChoice("nccl", f"nccl, one GPU per rank ({gpus} GPUs visible)")
    if gpus:
        return BackendChoice("gloo", f"gloo on CPU: {gpus} GPU(s) for {world_size} ranks is too few for NCCL")
    return BackendChoice("gloo", "gloo on CPU (no GPU found)")


def threads_per_rank(world_size: int) -> int:
    """Intra-op threads per rank so ranks do not oversubscribe the cores (2 threads/rank on 2 cores doubled
    compute time here). OMP_NUM_THREADS set by the user wins."""
    if os.environ.get("OMP_NUM_THREADS", "").isdigit():
        return max(1, int(os.environ["OMP_NUM_THREADS"]))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, world_size))


def loopback_ifname() -> str | None:
    """gloo binds to the interface named by GLOO_SOCKET_IFNAME; local ranks belong on loopback."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:  # pragma: no cover
        return None
    for name in ("lo", "lo0"):
        if name in names:
            return name
    return None


def _smoke():
    """The doctor's 2-rank all-reduce (module level so it pickles by reference)."""
    import torch
    import torch.distributed as dist

    x = torch.full((4,), float(dist.get_rank() + 1))
    dist.all_reduce(x)
    return x.tolist()


def doctor(out=print) -> int:
    """Print what a launch would use and run a 2-rank all-reduce. Returns a process exit code."""
    import platform
    import time

    problems = []
    out(f"python      {platform.python_version()} ({platform.system()} {platform.machine()})")
    try:
        import torch

        dist = dist_module()
    except ImportError as exc:
        out(f"torch       MISSING ({exc})")
        out("fix: run `make install` (or pip install 'torch>=2.4') in this environment")
        return 1
    out(f"torch       {torch.__version__} (CUDA build: {torch.version.cuda or 'no'})")
    out(f"gloo        {'yes' if dist.is_available() and dist.is_gloo_available() else 'NO'}")
    out(f"nccl        {'yes' if nccl_available() else 'no'}")
    gpus = gpu_count()
    out(f"GPUs        {gpus}")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    out(f"CPU cores   {cores}  (threads per rank at world size 2: {threads_per_rank(2)})")
    out(f"loopback    {loopback_ifname() or 'not found'}")
    if not (dist.is_available() and dist.is_gloo_available()):
        problems.append("this torch build has no gloo backend: install a standard torch wheel")
    try:
        choice = choose_backend(2, "auto")
        out(f"backend     {choice.backend}: {choice.reason}")
    except ValueError as exc:
        problems.append(str(exc))
        choice = None
    if choice is not None and not problems:
        from lab_utils.launch import LaunchError, launch

        try:
            t0 = time.perf_counter()
            cold = launch(_smoke, world_size=2, timeout=60, quiet=True)
            t1 = time.perf_counter()
            warm = launch(_smoke, world_size=2, timeout=60, quiet=True)
            t2 = time.perf_counter()
            ok = cold == warm == [[3.0] * 4, [3.0] * 4]
            out(f"all-reduce  {'ok' if ok else 'WRONG: ' + repr(cold)}  (first launch {t1 - t0:.2f} s, "
                f"warm launch {t2 - t1:.3f} s)")
            if not ok:
                problems.append("a 2-rank all-reduce gave a wrong sum")
        except (LaunchError, OSError) as exc:
            problems.append(f"a 2-rank launch failed: {exc}")
    for p in problems:
        out(f"PROBLEM     {p}")
    if problems:
        out("fix: `make clean test` rebuilds the environment; `dtlabs doctor` again to check")
        return 1
    out("all good")
    return 0
