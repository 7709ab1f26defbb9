"""Why grading and the test suite set ``lab_utils.processes.SHARED_CORES_ENV`` (``share_cores``): the same work in
N processes at once, with each library's default and with the setting, in the same run.

- ``omp``: libgomp (torch's OpenMP) lets a thread that finishes a parallel region spin for the others;
  ``OMP_WAIT_POLICY=PASSIVE`` sleeps instead. Work: a loop of small element-wise ops and matmuls (the size of a lab's
  tensors: parallel regions of a few microseconds) on torch's default intra-op threads.
- ``openblas``: numpy's OpenBLAS workers spin about 0.1 s waiting for work before they sleep, at start and after
  every threaded call; ``OPENBLAS_THREAD_TIMEOUT=4`` sleeps at once. Work: what every grader kernel, subject and rank
  server does first, ``import torch`` (which imports numpy), then a few numpy matmuls.

Printed per setting and process count: the medians of the wall seconds and of the machine CPU-seconds the processes
used, and the ratios default / set. With more processes than cores, spinning threads burn the cores the threads they
wait for need; one process alone on idle cores gains from spinning, which is why the settings are made only where
processes share the cores (grading, the test suite), not in a student's kernel.

    .venv/bin/python benchmarks/bench_shared_cores.py [--knob omp openblas] [--procs 1 2 4] [--rounds 3]
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

TORCH_WORK = r'''
import torch
torch.manual_seed(0)
a, b, m = torch.randn(200_000), torch.randn(200_000), torch.randn(192, 192)
for i in range(3000):
    c = a * b + a
    c.sum()
    if i % 10 == 0:
        m = torch.tanh(m @ m / 192)
'''
START_WORK = r'''
import numpy as np
import torch
m = np.random.default_rng(0).standard_normal((256, 256))
for _ in range(5):
    m = np.tanh(m @ m / 256)
'''
# knob -> (variable, value, work, target ratio of CPU-seconds default / set, where it applies). libgomp's spin costs
# most where processes outnumber the cores; OpenBLAS's spin yields the core, so it costs most where a core is idle.
KNOBS = {"omp": ("OMP_WAIT_POLICY", "PASSIVE", TORCH_WORK, 1.5, "more processes than cores"),
         "openblas": ("OPENBLAS_THREAD_TIMEOUT", "4", START_WORK, 1.1, "one process")}


def run(n: int, work: str, var: str, value: str | None) -> tuple[float, float]:
    """(wall seconds, CPU-seconds) of ``n`` processes running ``work`` at once with ``var`` set to ``value``
    (None: unset, the library's default)."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OPENBLAS_THREAD_TIMEOUT")}
    if value:
        env[var] = value
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    procs = [subprocess.Popen([sys.executable, "-c", work], env=env) for _ in range(n)]
    if any(p.wait() for p in procs):
        raise SystemExit("a benchmark process failed")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return time.monotonic() - start, cpu


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--knob", nargs="+", choices=sorted(KNOBS), default=sorted(KNOBS))
    ap.add_argument("--procs", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"machine: {cores} cores, load average {os.getloadavg()[0]:.2f}")
    ok = True
    for knob in args.knob:
        var, value, work, target, where = KNOBS[knob]
        for n in args.procs:
            got = {}
            for setting in (None, value):
                runs = [run(n, work, var, setting) for _ in range(args.rounds)]
                got[setting] = (statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs))
            (dw, dc), (sw, sc) = got[None], got[value]
            line = (f"{knob}, {n} process(es): default {dw:.2f} s {dc:.2f} CPU-s; {var}={value} {sw:.2f} s "
                    f"{sc:.2f} CPU-s; default / set: wall {dw / sw:.2f}, CPU {dc / sc:.2f}")
            if (n > cores) if where == "more processes than cores" else (n == 1):
                met = dc / sc >= target
                ok &= met
                line += f" (target CPU ratio >= {target} with {where}: {'met' if met else 'MISSED'})"
            print(line, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
