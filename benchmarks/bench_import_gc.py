"""Why the processes that import torch for others keep Python's cyclic collector off while they import
(``lab_utils.processes.collector_off_while_importing``; the zygote and the warm servers keep it off for good, as
Python's gc docs advise for fork servers, and turn it on in each child).

Importing torch makes hundreds of thousands of objects that live as long as the process, and the collector, counting
allocations, sets off collection after collection over them while the import runs. Each case below is run in a fresh
interpreter ROUNDS times with the collector as Python starts it and with it off, in turn, in the same run; printed:
the medians of the process's CPU-seconds and the ratio off / on.

- ``torch``: ``import torch`` (a grading subject's zygote; the fresh zygote of a student's kernel);
- ``agent``: what a torchrun agent imports before torchrun's main runs (``torch.distributed.launcher.api``);
- ``warm``: a warm server's preload (``lab_utils.warm.PRELOAD``: ipykernel, torch, numpy, ...).

    .venv/bin/python benchmarks/bench_import_gc.py [--case torch agent warm] [--rounds 5]
"""
from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
from pathlib import Path

TARGET = 0.85  # off / on CPU-seconds, at most, for every case
REPO = Path(__file__).resolve().parents[1]
CASES = {
    "torch": "import torch",
    "agent": "import torch.distributed.launcher.api",
    "warm": "import importlib\nfrom lab_utils.warm import PRELOAD\nfor n in PRELOAD:\n"
            "    importlib.import_module(n)",
}
OFF = "from lab_utils import processes\nwith processes.collector_off_while_importing():\n"


def _cpu(code: str) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", nargs="+", choices=sorted(CASES), default=list(CASES))
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    missed = []
    print(f"{'case':6s} {'collector on':>14s} {'off':>8s} {'off / on':>9s}   (CPU-seconds, medians of {args.rounds})")
    for case in args.case:
        code = CASES[case]
        wrapped = OFF + "".join(f"    {line}\n" for line in code.splitlines())
        on, off = [], []
        for _ in range(args.rounds):  # in turn, so a change in the machine's load hits both alike
            on.append(_cpu(code))
            off.append(_cpu(wrapped))
        ratio = statistics.median(off) / statistics.median(on)
        met = ratio <= TARGET
        missed += [] if met else [case]
        print(f"{case:6s} {statistics.median(on):14.3f} {statistics.median(off):8.3f} {ratio:9.2f}   "
              f"target <= {TARGET}: {'met' if met else 'MISSED'}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
