"""Launcher benchmark: start 2 gloo ranks, one all-reduce, return. Medians and ratios from one run.

Baselines, measured here in the same run (benchmarks/README.md):
  mp.spawn           torch.multiprocessing.spawn from a script (fresh interpreters: import torch each time)
  notebook_launcher  accelerate's fork-based launcher (fast, but forks the caller: unsafe with CUDA/threads)
  launch (cold)      the first lab_utils.launcher.launch in a fresh process: fork server start + import torch
  launch (warm)      later launches, fork server warm (what a student gets after the first cell)
Targets: warm <= 0.25 s, warm no slower than notebook_launcher, >= 20x faster than mp.spawn, cold <= mp.spawn.

    python benchmarks/bench_launch.py [--repeats N] [--json PATH]
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import socket
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_all_reduce():
    import torch
    import torch.distributed as dist

    t = torch.ones(4)
    dist.all_reduce(t)
    return t.tolist()


def _spawn_rank(rank, world_size, port):
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    one_all_reduce()
    dist.destroy_process_group()


def _accelerate_rank():
    import torch.distributed as dist

    dist.init_process_group("gloo")  # env:// variables set by notebook_launcher
    one_all_reduce()
    dist.destroy_process_group()


def time_mp_spawn(repeats):
    import torch.multiprocessing as mp

    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        mp.spawn(_spawn_rank, args=(2, _free_port()), nprocs=2, join=True)
        times.append(time.perf_counter() - t0)
    return times


def time_notebook_launcher(repeats):
    try:
        from accelerate import notebook_launcher
    except ImportError:
        return None
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        # accelerate prints "Launching training on 2 CUDAs." even on a CPU: keep it out of the report
        with contextlib.redirect_stdout(io.StringIO()):
            notebook_launcher(_accelerate_rank, num_processes=2, use_port=str(_free_port()))
        times.append(time.perf_counter() - t0)
    return times


COLD = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, sys.argv[1])
    import torch, torch.distributed
    from lab_utils import launch
    from bench_launch import one_all_reduce
    t0 = time.perf_counter()
    assert launch(one_all_reduce, world_size=2, quiet=True) == [[2.0] * 4] * 2
    print(time.perf_counter() - t0)
    """
)


def time_launch_cold(repeats):
    """The first launch in a fresh process (torch already imported there, as in a notebook)."""
    times = []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    for _ in range(repeats):
        out = subprocess.run([sys.executable, "-c", COLD, str(ROOT / "benchmarks")], env=env, check=True,
                             capture_output=True, text=True).stdout
        times.append(float(out.strip().splitlines()[-1]))
    return times


def time_launch_warm(repeats):
    from lab_utils import launch, prewarm

    prewarm(wait=True)
    launch(one_all_reduce, world_size=2, quiet=True)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        launch(one_all_reduce, world_size=2, quiet=True)
        times.append(time.perf_counter() - t0)
    return times


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="repeats of the slow baselines (warm: 4x this)")
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "results" / "launch.json")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(Path(__file__).parent))

    runs = {
        "launch_warm": time_launch_warm(4 * args.repeats),
        "notebook_launcher": time_notebook_launcher(args.repeats),
        "launch_cold": time_launch_cold(args.repeats),
        "mp_spawn": time_mp_spawn(args.repeats),
    }
    med = {k: statistics.median(v) for k, v in runs.items() if v}
    print(f"2 gloo ranks, start + one all-reduce + return; medians on {os.cpu_count()} cores")
    for name, value in med.items():
        print(f"  {name:18s} {value:8.3f} s   (n={len(runs[name])})")
    ratios = {"mp_spawn / launch_warm": med["mp_spawn"] / med["launch_warm"],
              "launch_cold / mp_spawn": med["launch_cold"] / med["mp_spawn"]}
    if "notebook_launcher" in med:
        ratios["launch_warm / notebook_launcher"] = med["launch_warm"] / med["notebook_launcher"]
    targets = {"mp_spawn / launch_warm": (">=", 20.0), "launch_cold / mp_spawn": ("<=", 1.0),
               "launch_warm / notebook_launcher": ("<=", 1.0)}
    print("ratios (same run):")
    ok = med["launch_warm"] <= 0.25
    for name, value in ratios.items():
        op, bound = targets[name]
        met = value >= bound if op == ">=" else value <= bound
        ok &= met
        print(f"  {name:32s} {value:8.2f}   target {op} {bound:g}  {'met' if met else 'MISSED'}")
    print(f"  launch_warm <= 0.25 s: {'met' if med['launch_warm'] <= 0.25 else 'MISSED'}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"runs": runs, "medians": med, "ratios": ratios}, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
