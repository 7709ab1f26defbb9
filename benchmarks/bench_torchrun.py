"""What forking torchrun's agents and workers from warm servers saves (``lab_utils.labkit.torchrun.warmstart``,
``c.DTLabs.warm_torchrun``): the same runs with them started cold and forked, in turn, in the same run.

Each round runs a fresh harness process that starts RUNS runs of 2 agents with 1 worker each (static rendezvous;
each worker joins a gloo group, all-reduces once and exits), with warm workers off and on: the machine's busy
CPU-seconds (``/proc/stat``: the servers, the agents and the workers are not all children that a process could count,
so run it on an idle machine) and the wall seconds, medians over ROUNDS, and the ratios on / off. The first run of
each harness is not counted (it starts the servers, which import torch while it waits).

    .venv/bin/python benchmarks/bench_torchrun.py [--runs 5] [--rounds 3]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

TARGET = 0.75  # warm / cold machine CPU-seconds, at most
HARNESS = r"""
import sys, tempfile
from lab_utils.labkit.torchrun import run_nodes, write_script

def job():
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.ones(4)
    dist.all_reduce(t)
    dist.destroy_process_group()

with tempfile.TemporaryDirectory(prefix="dtlabs-bench-torchrun-") as folder:
    script = write_script(f"{folder}/job.py", job, main="job()", header="import torch\nimport torch.distributed as dist")
    run_nodes(script, nnodes=2, nproc_per_node=1, timeout=120, quiet=True)  # not counted: the server starts
    print("READY", flush=True)
    sys.stdin.readline()
    for _ in range(int(sys.argv[1])):
        run_nodes(script, nnodes=2, nproc_per_node=1, timeout=120, quiet=True)
"""


def _busy() -> float:
    with open("/proc/stat") as fh:
        v = [int(x) for x in fh.readline().split()[1:]]
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def _round(harness: str, runs: int, warm: bool) -> tuple[float, float]:
    env = {**os.environ, "DTLABS_WARM_TORCHRUN": "1" if warm else "0"}
    proc = subprocess.Popen([sys.executable, harness, str(runs)], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "READY", "the harness did not start"
    time.sleep(1.0)  # the first run's processes are gone
    b0, t0 = _busy(), time.monotonic()
    proc.stdin.write("\n")
    proc.stdin.flush()
    if proc.wait(timeout=600):
        raise SystemExit(f"a harness failed (warm workers {'on' if warm else 'off'})")
    return _busy() - b0, time.monotonic() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}")
    got = {False: [], True: []}
    with tempfile.TemporaryDirectory(prefix="dtlabs-bench-torchrun-") as folder:
        harness = os.path.join(folder, "harness.py")  # a file: write_script reads the job's source from it
        with open(harness, "w") as fh:
            fh.write(HARNESS)
        for _ in range(args.rounds):
            for warm in (False, True):
                got[warm].append(_round(harness, args.runs, warm))
    med = {w: (statistics.median(c for c, _ in r), statistics.median(s for _, s in r)) for w, r in got.items()}
    cpu_ratio, wall_ratio = med[True][0] / med[False][0], med[True][1] / med[False][1]
    for warm in (False, True):
        print(f"agents and workers {'forked warm' if warm else 'started cold'}: {args.runs} runs of 2 agents x 1 worker, "
              f"{med[warm][0]:.1f} CPU-s, {med[warm][1]:.1f} s wall (medians of {args.rounds})")
    print(f"warm / cold: CPU {cpu_ratio:.2f} (target <= {TARGET}), wall {wall_ratio:.2f}; "
          f"load average now {os.getloadavg()[0]:.2f}")
    return 0 if cpu_ratio <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
