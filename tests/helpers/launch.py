"""Rank functions and process bookkeeping for the launcher tests.

Rank functions live in a module (not in the test files) so ranks import them cheaply by reference;
``test_notebook_output.py`` covers functions defined in a real notebook cell (shipped by value).
"""
from __future__ import annotations

import os
import time

import psutil


def all_reduce_rank_plus_one(n=4):
    import torch
    import torch.distributed as dist

    device = "cuda" if dist.get_backend() == "nccl" else "cpu"  # the launcher's own choice, as the labs do
    t = torch.full((n,), float(dist.get_rank() + 1), device=device)
    dist.all_reduce(t)
    return t


def report_env():
    import torch
    import torch.distributed as dist

    keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS"]
    return {
        **{k: os.environ.get(k) for k in keys},
        "dist_rank": dist.get_rank(),
        "dist_world": dist.get_world_size(),
        "backend": dist.get_backend(),
        "threads": torch.get_num_threads(),
        "pid": os.getpid(),
    }


def say_hello():
    import sys

    import torch.distributed as dist

    print(f"hello from rank {dist.get_rank()}")
    print(f"warning on stderr from rank {dist.get_rank()}", file=sys.stderr)
    return dist.get_rank()


def rank1_raises():
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise ValueError("rank one is unhappy")
    dist.barrier()  # rank 0 waits for a peer that is gone
    return "unreachable"


def rank1_killed():
    import signal

    import torch.distributed as dist

    if dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    t = __import__("torch").ones(1)
    dist.all_reduce(t)  # fails on rank 0 once rank 1 is gone: a symptom, not the cause
    return t


def rank1_skips_all_reduce():
    import torch
    import torch.distributed as dist

    t = torch.ones(3)
    if dist.get_rank() != 1:
        dist.all_reduce(t)  # rank 1 never joins: rank 0 waits here
    return t


def sleep_forever(marker_dir):
    import torch.distributed as dist

    with open(os.path.join(marker_dir, f"rank{dist.get_rank()}.pid"), "w") as f:
        f.write(str(os.getpid()))
    while True:
        time.sleep(0.1)


def frozen_objects():
    """How many objects this rank's garbage collector leaves alone (``gc.freeze``: the zygote's, made before the fork),
    and whether it collects at all (the zygote runs without the collector; a rank runs a student's code)."""
    import gc

    return gc.get_freeze_count(), gc.isenabled()


def returns_own_rank():
    import torch.distributed as dist

    return dist.get_rank()


# ------------------------------------------------------------------------------------ process bookkeeping
def dtlabs_processes(kind="rank"):
    """Live processes named dtlabs-rank* (or dtlabs-zygote) on this machine."""
    found = []
    for p in psutil.process_iter(["name", "status"]):
        try:
            if p.info["name"] and p.info["name"].startswith(f"dtlabs-{kind}") and p.info["status"] != "zombie":
                found.append(p)
        except psutil.Error:
            pass
    return found


def wait_gone(pids, timeout=10.0):
    """Pids still alive (not zombies) after waiting up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [pid for pid in alive if _alive(pid)]
        if alive:
            time.sleep(0.1)
    return alive


def _alive(pid):
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def all_reduce_then_hold(flag: str, value: float):
    """All-reduce ``value`` (a secret the test looks for), then wait until ``flag`` exists: the group, its store and
    gloo's pairs stay up while the test looks at them from outside. Returns the sum and this rank's network."""
    import torch
    import torch.distributed as dist

    t = torch.full((4,), value)
    dist.all_reduce(t)
    deadline = time.monotonic() + 60
    while not os.path.exists(flag) and time.monotonic() < deadline:
        time.sleep(0.05)
    dist.barrier()  # the group still works after whatever the test tried
    return t.tolist(), os.readlink("/proc/self/ns/net")


def wait_for_ranks(n: int, timeout: float = 60.0) -> list:
    """The pids of this process's ``n`` rank processes (its descendants named dtlabs-rank*), once all are up."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ranks = []
        for p in psutil.Process().children(recursive=True):
            try:
                if p.name().startswith("dtlabs-rank") and p.status() != psutil.STATUS_ZOMBIE:
                    ranks.append(p.pid)
            except psutil.Error:
                pass
        if len(ranks) >= n:
            return ranks
        time.sleep(0.1)
    raise TimeoutError(f"{n} ranks did not start in {timeout:.0f} s")
