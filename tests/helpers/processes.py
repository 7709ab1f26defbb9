"""Process leaks, counted only among processes *this test started*: the ``no_leaked_processes`` fixture puts a fresh
token in the environment, every process started during the test inherits it, and afterwards any survivor carrying
it (a rank ``dtlabs-rank*``, a ``dtlabs-zygote`` that is not this process's own warm one, a torchrun agent or
worker, a kernel) fails the test. Other people's notebooks on a shared machine are never counted or signalled."""
from __future__ import annotations

import os
import time

import psutil

from lab_utils import grading

TEST_TOKEN_VAR = "DTLABS_TEST_TOKEN"  # not grading.TOKEN_VAR: grading sets its own token per nbgrader run


def _describe(p) -> str:
    try:
        return f"pid {p.pid} {p.name()!r}: {' '.join(p.cmdline())[:160]}"
    except psutil.Error:
        return f"pid {p.pid} (gone)"


def is_rank_like(p) -> bool:
    """A rank, a zygote, a torchrun agent or an elastic worker."""
    try:
        name = p.name()
        if name.startswith("dtlabs-rank") or name == "dtlabs-zygote":
            return True
        cmd = " ".join(p.cmdline())
        if "torchrun" in cmd or "torch.distributed.run" in cmd or "torch.distributed.launch" in cmd:
            return True
        return "TORCHELASTIC_RUN_ID" in p.environ()
    except psutil.Error:
        return False


def leftover_processes(token: str, wait_s: float = 5.0) -> list:
    """Processes started under ``token`` still alive after ``wait_s``, except this process's own warm zygote."""
    me = os.getpid()
    deadline = time.monotonic() + wait_s
    while True:
        left = []
        for p in grading.processes_with_token(token, var=TEST_TOKEN_VAR):
            try:
                if p.ppid() == me and p.name() == "dtlabs-zygote":
                    continue  # launch() in this process keeps one warm fork server by design
            except psutil.Error:
                continue
            left.append(p)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def assert_no_leftovers(token: str, wait_s: float = 5.0) -> None:
    """Fail (after killing them) if anything started under ``token`` survives; ranks are named first."""
    left = leftover_processes(token, wait_s)
    if left:
        ranks = [p for p in left if is_rank_like(p)]
        desc = "\n  ".join(_describe(p) for p in (ranks or left))
        grading.reap(token, var=TEST_TOKEN_VAR)
        kind = "rank/zygote/torchrun process(es)" if ranks else "process(es)"
        raise AssertionError(f"{len(ranks or left)} {kind} survived the test:\n  {desc}")
