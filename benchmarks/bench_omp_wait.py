"""Why grading sets OMP_WAIT_POLICY=PASSIVE (``lab_utils.processes.share_cores``): the same torch work in N processes
at once, with libgomp's default wait policy (a thread spins for the others at the end of a parallel region) and with
PASSIVE (it sleeps), in the same run.

Each process runs a loop of small element-wise ops and matmuls (the size of a lab's tensors: parallel regions of a
few microseconds) on torch's default intra-op threads. Printed per policy and process count: the medians of the wall
seconds and of the machine CPU-seconds the processes used, and the ratios default / PASSIVE. With more processes than
cores, spinning threads burn the cores the threads they wait for need; one process alone on idle cores gains from
spinning, which is why the policy is set only where processes share the cores (grading, the test suite), not in a
student's kernel.

    .venv/bin/python benchmarks/bench_omp_wait.py [--procs 1 2 4] [--rounds 3]
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

WORK = r'''
import torch
torch.manual_seed(0)
a, b, m = torch.randn(200_000), torch.randn(200_000), torch.randn(192, 192)
for i in range(3000):
    c = a * b + a
    c.sum()
    if i % 10 == 0:
        m = torch.tanh(m @ m / 192)
'''
TARGET_RATIO = 1.5  # default / PASSIVE in CPU-seconds, with more processes than cores


def run(n: int, policy: str | None) -> tuple[float, float]:
    """(wall seconds, CPU-seconds) of ``n`` processes running WORK at once under ``policy`` (None: libgomp's default)."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if policy:
        env["OMP_WAIT_POLICY"] = policy
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    procs = [subprocess.Popen([sys.executable, "-c", WORK], env=env) for _ in range(n)]
    if any(p.wait() for p in procs):
        raise SystemExit("a benchmark process failed")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return time.monotonic() - start, cpu


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--procs", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"machine: {cores} cores, load average {os.getloadavg()[0]:.2f}")
    ok = True
    for n in args.procs:
        got = {}
        for policy in (None, "PASSIVE"):
            runs = [run(n, policy) for _ in range(args.rounds)]
            got[policy] = (statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs))
        (dw, dc), (pw, pc) = got[None], got["PASSIVE"]
        line = (f"{n} process(es): default {dw:.2f} s {dc:.2f} CPU-s; PASSIVE {pw:.2f} s {pc:.2f} CPU-s; "
                f"default / PASSIVE: wall {dw / pw:.2f}, CPU {dc / pc:.2f}")
        if n > cores:
            met = dc / pc >= TARGET_RATIO
            ok &= met
            line += f" (target CPU ratio >= {TARGET_RATIO}: {'met' if met else 'MISSED'})"
        print(line, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
