"""``%%distributed`` benchmark: per-cell overhead of a 2-rank cell with one all-reduce, medians from one run.

  %%distributed   a cell on 2 persistent ranks (started once with %dist start), through IPython's run_cell
  launch (warm)   lab_utils.launcher.launch of the same work, fork server warm: fresh ranks and a new group per call
  %%px            ipyparallel's cell magic on 2 engines, only if ipyparallel is installed (not a dependency)
Target: a %%distributed cell costs <= 0.05 s.

    python benchmarks/bench_distributed.py [--repeats N] [--json PATH]
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CELL = "t = torch.ones(4)\ndist.all_reduce(t)\n"
TARGET_S = 0.05


def one_all_reduce():
    import torch
    import torch.distributed as dist

    t = torch.ones(4)
    dist.all_reduce(t)
    return t.tolist()


def _median(fn, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_distributed(shell, repeats):
    with contextlib.redirect_stdout(io.StringIO()):
        shell.run_line_magic("dist", "start -n 2")
        shell.run_cell("%%distributed\n" + CELL)  # warm-up
    try:
        def cell():
            result = shell.run_cell("%%distributed\n" + CELL)
            if not result.success:
                raise RuntimeError(f"the %%distributed cell failed: {result.error_in_exec}")
        return _median(cell, repeats)
    finally:
        with contextlib.redirect_stdout(io.StringIO()):
            shell.run_line_magic("dist", "stop")


def bench_launch_warm(repeats):
    from lab_utils import launch, prewarm

    prewarm(wait=True)
    launch(one_all_reduce, world_size=2, quiet=True)  # warm-up
    return _median(lambda: launch(one_all_reduce, world_size=2, quiet=True), repeats)


def bench_px(shell, repeats):
    try:
        import ipyparallel as ipp
    except ImportError:
        return None, "not installed"
    cluster = ipp.Cluster(n=2, log_level=40)
    rc = cluster.start_and_connect_sync()
    try:
        rc.wait_for_engines(2, timeout=120)
        view = rc[:]
        view.activate()

        def setup(rank, port):
            import os

            import torch.distributed as dist

            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            dist.init_process_group("gloo", rank=rank, world_size=2)

        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        ars = [rc[i].apply_async(setup, i, port) for i in range(2)]
        for ar in ars:
            ar.get(timeout=120)
        view.execute("import torch, torch.distributed as dist", block=True)
        shell.run_cell("%%px\n" + CELL)
        return _median(lambda: shell.run_cell("%%px\n" + CELL), repeats), "measured"
    finally:
        cluster.stop_cluster_sync()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    from IPython.testing.globalipapp import start_ipython

    shell = start_ipython()
    shell.run_line_magic("load_ext", "lab_utils")
    results = {}
    results["launch_warm_s"] = bench_launch_warm(args.repeats)
    results["distributed_cell_s"] = bench_distributed(shell, args.repeats)
    px, px_note = bench_px(shell, args.repeats)
    results["px_cell_s"] = px
    results["px"] = px_note

    d, w = results["distributed_cell_s"], results["launch_warm_s"]
    print(f"%%distributed cell (2 ranks, 1 all_reduce): median {d * 1000:.1f} ms "
          f"({'meets' if d <= TARGET_S else 'MISSES'} the {TARGET_S * 1000:.0f} ms target)")
    print(f"launch, warm (same work, fresh ranks):      median {w * 1000:.1f} ms  -> %%distributed is {w / d:.1f}x faster")
    if px is None:
        print(f"ipyparallel %%px:                            {px_note}")
    else:
        print(f"ipyparallel %%px (2 engines):                median {px * 1000:.1f} ms  -> ratio px/distributed {px / d:.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
