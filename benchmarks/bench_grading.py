"""How long the instructor's `dtlabs grade` takes for one student who submitted all six labs.

design.md section 6: "autograde of one full submission (six labs): under 10 minutes" on 2 CPU cores. This
builds a scratch course (a copy of solutions/, nothing in the repository is touched), submits every lab's
solution as one student, runs the same `lab_utils.grading.grade` that `dtlabs grade` runs (gradebook,
autograde, CSV export, feedback) and prints each lab's autograde seconds, the total, and the score.

    .venv/bin/python benchmarks/bench_grading.py [LAB ...]
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import nbformat

from lab_utils import grading

TARGET_S = 600.0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("labs", nargs="*", help="labs to grade (default: every lab in solutions/)")
    args = ap.parse_args(argv)
    labs = args.labs or grading.discover_labs()
    with tempfile.TemporaryDirectory(prefix="dtlabs-bench-grade-") as tmp:
        root = Path(tmp)
        for lab in labs:
            shutil.copytree(grading.REPO_ROOT / "solutions" / lab, root / "solutions" / lab)
        grading.release(labs, root=root)
        for lab in labs:
            rel = nbformat.read(str(root / "labs" / lab / f"{lab}.ipynb"), as_version=4)
            src = nbformat.read(str(root / "solutions" / lab / f"{lab}.ipynb"), as_version=4)
            grading.submit(root, "student", lab, grading.fill_solutions(rel, src))
        lines = []
        start = time.monotonic()
        code = grading.grade(labs, course_root=root, out=lambda s: (lines.append(s), print(s, flush=True)))
        total = time.monotonic() - start
        scores = {lab: grading.cell_scores(root, lab, "student") for lab in labs}
    earned = sum(s for sc in scores.values() for s, _ in sc.values())
    possible = sum(m for sc in scores.values() for _, m in sc.values())
    print(f"\none student, {len(labs)} lab(s): dtlabs grade took {total:.0f} s "
          f"(autograde + export + feedback), score {earned:g}/{possible:g}")
    if len(labs) == len(grading.discover_labs()):
        print(f"  total / 10-minute target = {total / TARGET_S:.2f}  ({'met' if total <= TARGET_S else 'MISSED'})")
    return code


if __name__ == "__main__":
    sys.exit(main())
