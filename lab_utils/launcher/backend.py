"""Which backend and devices a launch gets, decided without initialising CUDA in the notebook.

Initialising CUDA in the notebook process would make every later fork unsafe and pin GPU memory in the
kernel; ``torch.cuda.device_count()`` is NVML-based where possible and leaves CUDA uninitialised.
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from lab_utils import cgroups

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
    """Intra-op threads per rank so ranks do not oversubscribe the CPUs they may use (2 threads/rank on 2 cores
    doubled compute time here): the CPU budget (``lab_utils.cgroups``: the cgroup's quota, the cpuset and the affinity
    mask) shared among the ranks. OMP_NUM_THREADS set by the user wins."""
    if os.environ.get("OMP_NUM_THREADS", "").isdigit():
        return max(1, int(os.environ["OMP_NUM_THREADS"]))
    return max(1, cgroups.cpu_budget().cpus // max(1, world_size))


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
