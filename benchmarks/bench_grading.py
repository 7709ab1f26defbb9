"""How long the instructor's `dtlabs grade` takes, sandboxed, and what `--jobs 2` buys on this machine.

Three measurements in one run, on scratch courses (a copy of solutions/; nothing in the repository is touched):

1. baseline: one student who submitted every lab, graded without split execution or a sandbox (nbgrader's own
   Execute in the kernel, all submissions of a lab in one nbgrader run);
2. sandboxed: the same student through `dtlabs grade` (a sandbox and scratch course per submission), and the
   ratio to the baseline (target: at most 1.2);
3. `--jobs 1` against `--jobs 2` for STUDENTS students (default 2), and the speed-up;
4. STUDENTS students graded with every nbgrader run started cold (`python -m nbgrader`) against forked from the warm
   server (`c.DTLabs.warm_nbgrader`, started afresh for the measurement): the machine's CPU-seconds (psutil's
   system-wide times, so run it on an idle machine) per submission, and the ratio.

Before them, each lab's canary (its solution and empty release, graded once per machine and environment, then kept)
is graded and timed on its own: it is what the first `dtlabs grade` of a lab pays, never a submission's cost.

    .venv/bin/python benchmarks/bench_grading.py [LAB ...] [--students N] [--skip-jobs] [--skip-warm]
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import nbformat

from lab_utils import grading
from lab_utils.grading import canary, nbgrader_run

TARGET_RATIO = 1.2


def _course(root: Path, labs, students) -> None:
    for lab in labs:
        shutil.copytree(grading.REPO_ROOT / "solutions" / lab, root / "solutions" / lab)
    grading.release(labs, root=root)
    for lab in labs:
        rel = nbformat.read(str(root / "labs" / lab / f"{lab}.ipynb"), as_version=4)
        src = nbformat.read(str(root / "solutions" / lab / f"{lab}.ipynb"), as_version=4)
        for s in students:
            grading.submit(root, s, lab, grading.fill_solutions(rel, src))


def _points(root, labs, student) -> str:
    sc = [grading.cell_scores(root, lab, student) for lab in labs]
    return f"{sum(s for d in sc for s, _ in d.values()):g}/{sum(m for d in sc for _, m in d.values()):g}"


def baseline(labs) -> tuple[float, str]:
    """The pre-sandbox path: per lab one `nbgrader autograde` with nbgrader's plain Execute."""
    with tempfile.TemporaryDirectory(prefix="dtlabs-bench-base-") as tmp:
        root = Path(tmp)
        _course(root, labs, ["student"])
        os.environ["DTLABS_BENCH_BASELINE"] = "1"
        try:
            start = time.monotonic()
            for lab in labs:
                grading.autograde(lab, course_root=root)
            took = time.monotonic() - start
        finally:
            os.environ.pop("DTLABS_BENCH_BASELINE", None)
        return took, _points(root, labs, "student")


def sandboxed(labs, students, jobs) -> tuple[float, str]:
    with tempfile.TemporaryDirectory(prefix="dtlabs-bench-grade-") as tmp:
        root = Path(tmp)
        _course(root, labs, students)
        start = time.monotonic()
        grading.grade(labs, course_root=root, jobs=jobs, feedback=False, out=lambda s: None, progress=False)
        took = time.monotonic() - start
        return took, " ".join(_points(root, labs, s) for s in students)


def _busy_cpu_s() -> float:
    """CPU-seconds every process of the machine has used so far: all CPU time but idle and I/O wait."""
    import psutil

    t = psutil.cpu_times()
    return t.user + t.nice + t.system + t.irq + t.softirq + t.steal


def warm_vs_cold(labs, students) -> dict:
    """Machine CPU-seconds per submission with nbgrader started cold and warm (a fresh server), one job at a time."""
    out = {}
    for mode in ("cold", "warm"):
        nbgrader_run.stop_warm_server()
        os.environ["DTLABS_WARM_NBGRADER"] = "1" if mode == "warm" else "0"
        try:
            with tempfile.TemporaryDirectory(prefix=f"dtlabs-bench-{mode}-") as tmp:
                root = Path(tmp)
                _course(root, labs, students)
                canary_out = [canary.check(root, lab, out=lambda s: None) for lab in labs]  # kept from above
                assert all(v.ok for v in canary_out)
                cpu, start = _busy_cpu_s(), time.monotonic()
                grading.grade(labs, course_root=root, jobs=1, feedback=False, out=lambda s: None, progress=False)
                out[mode] = ((_busy_cpu_s() - cpu) / (len(labs) * len(students)), time.monotonic() - start,
                             " ".join(_points(root, labs, s) for s in students))
        finally:
            os.environ.pop("DTLABS_WARM_NBGRADER", None)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("labs", nargs="*", help="labs to grade (default: every lab in solutions/)")
    ap.add_argument("--students", type=int, default=2, help="students for the --jobs comparison (default 2)")
    ap.add_argument("--skip-jobs", action="store_true", help="only the baseline and one sandboxed student")
    ap.add_argument("--skip-warm", action="store_true", help="leave out the cold/warm nbgrader comparison")
    args = ap.parse_args(argv)
    labs = args.labs or grading.discover_labs()
    print(f"labs: {' '.join(labs)}", flush=True)
    with tempfile.TemporaryDirectory(prefix="dtlabs-bench-canary-") as tmp:
        root = Path(tmp)
        _course(root, labs, [])
        start = time.monotonic()
        verdicts = [canary.check(root, lab, force=True, out=lambda s: None) for lab in labs]
        print(f"canary (each lab's solution and release, once per machine): {time.monotonic() - start:.0f} s, "
              + ("all pass" if all(v.ok for v in verdicts) else "FAILED: " + "; ".join(v.explain() for v in verdicts
                                                                                    if not v.ok)), flush=True)
    base, base_pts = baseline(labs)
    print(f"baseline (no split, no sandbox), one student: {base:.0f} s, {base_pts}", flush=True)
    one, one_pts = sandboxed(labs, ["student"], jobs=1)
    ratio = one / base
    print(f"dtlabs grade (split + sandbox), one student:  {one:.0f} s, {one_pts}", flush=True)
    print(f"  sandboxed / baseline = {ratio:.2f}  (target <= {TARGET_RATIO}: {'met' if ratio <= TARGET_RATIO else 'MISSED'})")
    if not args.skip_jobs:
        students = [f"s{i}" for i in range(args.students)]
        j1, _ = sandboxed(labs, students, jobs=1)
        j2, pts = sandboxed(labs, students, jobs=2)
        print(f"{len(students)} students: --jobs 1 {j1:.0f} s, --jobs 2 {j2:.0f} s ({pts})")
        print(f"  speed-up of --jobs 2 = {j1 / j2:.2f}x on {os.cpu_count()} cores")
    if not args.skip_warm:
        students = [f"w{i}" for i in range(args.students)]
        res = warm_vs_cold(labs, students)
        for mode, (cpu, wall, pts) in res.items():
            print(f"{len(students)} students, nbgrader {mode}: {cpu:.2f} CPU-s per submission, {wall:.0f} s ({pts})")
        print(f"  warm / cold CPU per submission = {res['warm'][0] / res['cold'][0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
