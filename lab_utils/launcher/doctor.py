"""`dtlabs doctor`: is this machine ready? torch, backends, GPUs, a real 2-rank all-reduce, and whether another
local user could read a kernel's cells (``kernel_channels``).

Its own module because it needs both ``backend`` (what a launch would choose) and ``launch`` (to try one), and
``launch`` imports ``backend``: kept apart, neither imports the other's importer.
"""
from __future__ import annotations

from lab_utils import cgroups
from lab_utils.launcher.backend import (
    choose_backend, dist_module, gpu_count, loopback_ifname, nccl_available, threads_per_rank,
)
from lab_utils.launcher.launch import LaunchError, launch
from lab_utils.status import Status


def _smoke():
    """The doctor's 2-rank all-reduce (module level so it pickles by reference)."""
    import torch
    import torch.distributed as dist

    x = torch.full((4,), float(dist.get_rank() + 1))
    dist.all_reduce(x)
    return x.tolist()


def _network(out) -> None:
    """Where the ranks just launched listened: a network of their own (``lab_utils.netns``), or the machine's
    loopback, which other local users reach (a warning: a container that refuses namespaces has no better)."""
    from lab_utils.launcher import zygote

    network = zygote.get_zygote().network
    out(f"ranks' net  {network}")
    if network != "private":
        out("WARNING     other local users can connect to the ranks' rendezvous and gloo's ports (one user per "
            "machine, or c.DTLabs.private_network on where the machine allows user namespaces)")


def doctor(out=print) -> Status:
    """Print what a launch would use, run a 2-rank all-reduce and say where kernels listen: DONE when it all works
    and no other user could subscribe to a kernel, INCOMPLETE (with a fix) otherwise."""
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
        return Status.INCOMPLETE
    out(f"torch       {torch.__version__} (CUDA build: {torch.version.cuda or 'no'})")
    out(f"gloo        {'yes' if dist.is_available() and dist.is_gloo_available() else 'NO'}")
    out(f"nccl        {'yes' if nccl_available() else 'no'}")
    gpus = gpu_count()
    out(f"GPUs        {gpus}")
    budget, mem = cgroups.cpu_budget(), cgroups.memory()
    out(f"CPU budget  {budget.cpus}: {budget.source}  (threads per rank at world size 2: {threads_per_rank(2)})")
    out(f"memory      limit {cgroups.mb(mem.limit)}, {cgroups.mb(mem.usage)} in use ({mem.source})")
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
            _network(out)
        except (LaunchError, OSError) as exc:
            problems.append(f"a 2-rank launch failed: {exc}")
    try:
        from lab_utils.launcher import kernel_channels  # lazily: it imports jupyter_server
    except ImportError as exc:
        out(f"kernels     unknown: no Jupyter server in this environment ({exc})")
    else:
        problems += kernel_channels.report(out)
    for p in problems:
        out(f"PROBLEM     {p}")
    if problems:
        out("fix: `make clean test` rebuilds the environment; `dtlabs doctor` again to check")
        return Status.INCOMPLETE
    out("all good")
    return Status.DONE
