"""How long a student's `dtlabs validate` takes against `nbgrader validate` on the same notebook, and what a grader
kernel costs to start cold and forked warm (c.DTLabs.warm_kernels).

Two measurements in one run, on a scratch course (a copy of solutions/, released, each lab's release filled with its
solutions; nothing in the repository is touched):

1. per lab: `dtlabs validate NB` and `nbgrader validate NB` as a student runs them (fresh processes, in turn,
   ROUNDS times, medians), and the ratio (target: at most 0.5); and the notebook's floor: its cells alone, run in
   turn in a kernel that was started, answered and imported what a warm grader kernel preloads before the clock
   started (nbclient, as nbgrader executes them).
   A validate that executes every cell, as grading does, spends about that at least, so the floor over `nbgrader
   validate` is about the least ratio any validate can reach on that lab: where it is well above 0.5 the target
   cannot be met without leaving cells out;
2. kernels: KERNELS kernels started through the course's kernel manager, cold and warm, each until it has answered
   and imported torch and numpy (what every grader kernel does first): the kernel's own CPU-seconds (psutil, so
   other load on a shared machine does not count) and the wall seconds, medians, and the warm server's one-time
   CPU-seconds.

The load average is printed with the figures: wall times on a shared machine move with it, ratios less.

    .venv/bin/python benchmarks/bench_validate.py [LAB ...] [--rounds N] [--kernels N] [--skip-validate]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
import psutil

from lab_utils import grading
from lab_utils.grading.course import discover_labs

TARGET_RATIO = 0.5


def _filled(root: Path, labs) -> dict:
    """A scratch course with each lab's release filled with its solutions: lab -> that notebook."""
    for lab in labs:
        shutil.copytree(grading.REPO_ROOT / "solutions" / lab, root / "solutions" / lab)
    grading.release(labs, root=root)
    out = {}
    for lab in labs:
        path = root / "labs" / lab / f"{lab}.ipynb"
        src = nbformat.read(str(root / "solutions" / lab / f"{lab}.ipynb"), as_version=4)
        nbformat.write(grading.fill_solutions(nbformat.read(str(path), as_version=4), src), str(path))
        out[lab] = path
    return out


def _timed(cmd, cwd) -> tuple[float, int]:
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.monotonic() - start, proc.returncode


def validate_ratio(nb: Path, rounds: int) -> dict:
    bindir = Path(sys.executable).parent
    ours, theirs = [], []
    for _ in range(rounds):
        t, code = _timed([str(bindir / "dtlabs"), "validate", str(nb)], nb.parent)
        ours.append(t)
        if code != 0:  # a lab this machine cannot run (Lab 10's frameworks, Lab 11's GPU kernels not installed)
            return {"error": f"dtlabs validate exited {code} on the solution-filled notebook"}
        t, code = _timed([sys.executable, "-m", "nbgrader", "validate", str(nb)], nb.parent)
        theirs.append(t)
    floor = statistics.median(cells_alone(nb) for _ in range(rounds))
    return {"dtlabs": statistics.median(ours), "nbgrader": statistics.median(theirs), "cells": floor}


def cells_alone(nb: Path) -> float:
    """Seconds the notebook's cells take, in order, in a plain kernel that is up, and has imported what a warm
    grader kernel preloads (torch, numpy, the launcher: ``warm.PRELOAD``), before the clock starts."""
    from jupyter_client import KernelManager
    from nbclient import NotebookClient

    from lab_utils import warm

    notebook = nbformat.read(str(nb), as_version=4)
    km = KernelManager(kernel_name="python3")
    km.start_kernel(cwd=str(nb.parent), stderr=subprocess.DEVNULL)  # its TCP warning, not the cells' output
    try:
        client = NotebookClient(notebook, km=km, timeout=600, resources={"metadata": {"path": str(nb.parent)}})
        client.start_new_kernel_client()
        client.kc.execute_interactive("import " + ", ".join(warm.PRELOAD), timeout=120)
        start = time.monotonic()
        for index, cell in enumerate(notebook.cells):
            client.execute_cell(cell, index)
        return time.monotonic() - start
    finally:
        km.shutdown_kernel(now=True)


async def _one_kernel() -> tuple[float, float, bool]:
    from lab_utils.grading.split.kernels import PrivateSocketKernelManager

    km = PrivateSocketKernelManager(kernel_name="python3")
    start = time.monotonic()
    await km.start_kernel()
    kc = km.client()
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=120)
        await kc.execute_interactive("import torch, numpy", timeout=120)
        wall = time.monotonic() - start
        cpu = sum(psutil.Process(km.provisioner.pid).cpu_times()[:4])
        return cpu, wall, bool(getattr(km.provisioner, "warm", False))
    finally:
        kc.stop_channels()
        await km.shutdown_kernel(now=True)


def kernels(n: int) -> dict:
    from lab_utils import warm

    out = {}
    for mode in ("0", "1"):
        os.environ["DTLABS_WARM_KERNELS"] = mode
        runs = [asyncio.run(_one_kernel()) for _ in range(n + (mode == "1"))]  # the first warm one starts the server
        if mode == "1":
            server = next(s for k, s in warm._SERVERS.items() if k[0] == warm.KERNEL.name)
            out["server_cpu_s"] = sum(psutil.Process(server.proc.pid).cpu_times()[:4])
            runs = runs[1:]
            if not all(r[2] for r in runs):
                raise SystemExit("warm kernels started cold: see `dtlabs doctor`")
        out[mode] = {"cpu_s": statistics.median(r[0] for r in runs), "wall_s": statistics.median(r[1] for r in runs)}
    os.environ.pop("DTLABS_WARM_KERNELS")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("labs", nargs="*")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--kernels", type=int, default=5)
    ap.add_argument("--skip-validate", action="store_true")
    args = ap.parse_args(argv)
    load = os.getloadavg()
    print(f"machine: {os.cpu_count()} cores, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    k = kernels(args.kernels)
    cold, hot = k["0"], k["1"]
    print(f"kernel ready + torch/numpy imported, medians of {args.kernels}: cold {cold['cpu_s']:.2f} CPU-s "
          f"{cold['wall_s']:.2f} s wall; warm {hot['cpu_s']:.2f} CPU-s {hot['wall_s']:.2f} s wall "
          f"(ratio CPU {hot['cpu_s'] / cold['cpu_s']:.2f}, wall {hot['wall_s'] / cold['wall_s']:.2f}); the warm server "
          f"once: {k['server_cpu_s']:.2f} CPU-s")
    if args.skip_validate:
        return 0
    labs = args.labs or discover_labs(grading.REPO_ROOT)
    worst, unreachable = 0.0, []
    with tempfile.TemporaryDirectory(prefix="dtlabs-bench-validate-") as tmp:
        for lab, nb in _filled(Path(tmp), labs).items():
            r = validate_ratio(nb, args.rounds)
            if "error" in r:
                print(f"{lab}: not measured: {r['error']}", flush=True)
                continue
            ratio, floor = r["dtlabs"] / r["nbgrader"], r["cells"] / r["nbgrader"]
            worst = max(worst, ratio)
            if floor > TARGET_RATIO:
                unreachable.append(lab)
            print(f"{lab}: dtlabs validate {r['dtlabs']:.1f} s, nbgrader validate {r['nbgrader']:.1f} s, "
                  f"ratio {ratio:.2f} (target <= {TARGET_RATIO}); its cells alone {r['cells']:.1f} s, "
                  f"floor {floor:.2f}", flush=True)
    print(f"load average now {os.getloadavg()[0]:.2f}; worst ratio {worst:.2f}")
    if unreachable:
        print(f"floor above {TARGET_RATIO} (running the cells alone costs more than the target allows): "
              f"{', '.join(unreachable)}")
    return 0 if worst <= TARGET_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
