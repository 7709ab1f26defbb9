"""``dtlabs stress``: grade each lab's own solution K times on a loaded machine; every lost point is a flake.

An honest solution must never lose points. A grading machine is rarely idle (other graders, ``--jobs N``), so a
test that races processes or depends on speed can pass on an idle laptop and fail one run in three there. This
command makes that visible: it keeps the other cores busy (``nproc - 1`` busy-loop processes, started here and
always stopped here), autogrades the unchanged solution of each lab K times in a scratch course, and reports
every run that did not get full marks with the failing cell's grade_id and nbgrader's error line.

    dtlabs stress 05_multi_node --k 10       # or: make stress K=10 LABS=05_multi_node
    dtlabs stress --tests '-n 2 tests/labkit/test_torchrun.py' --k 10   # the project's own tests, 10 runs in a row

The grading steps come from ``lab_utils.grading`` through the three small functions below (``_prepare``,
``_grade_once``, ``_error_lines``), the only places that know its API.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from lab_utils import cgroups

__all__ = ["stress", "stress_tests", "StressRun", "busy_cores"]

STUDENT = "stress{:03d}"


@dataclass
class StressRun:
    """One autograde of one lab's solution."""

    lab: str
    index: int
    scores: dict  # grade_id -> (score, max)
    seconds: float
    errors: dict = field(default_factory=dict)  # grade_id -> nbgrader's error line for cells short of full marks
    note: str = ""  # what went wrong outside the cells (timeout, nbgrader failure)

    @property
    def points(self) -> tuple:
        return sum(s for s, _ in self.scores.values()), sum(m for _, m in self.scores.values())

    @property
    def full(self) -> bool:
        got, total = self.points
        return bool(self.scores) and total > 0 and got >= total and not self.note

    @property
    def lost(self) -> dict:
        return {gid: s for gid, s in self.scores.items() if s[0] < s[1]}


# ------------------------------------------------------------------------------------------ grading seam
def _prepare(lab: str, course_root: Path, repo_root: Path):
    """A scratch course holding `lab`: its release (gradebook with the hidden tests) and the full solution."""
    import nbformat

    from lab_utils import grading

    shutil.copytree(repo_root / "solutions" / lab, course_root / "solutions" / lab)
    grading.release([lab], root=course_root)
    rel = nbformat.read(str(course_root / "labs" / lab / f"{lab}.ipynb"), as_version=4)
    src = nbformat.read(str(repo_root / "solutions" / lab / f"{lab}.ipynb"), as_version=4)
    return grading.fill_solutions(rel, src)


def _grade_once(lab: str, course_root: Path, student: str, nb, cell_timeout, lab_timeout):
    """Submit `nb` as `student` and autograde it (only it: earlier students are already graded)."""
    from lab_utils import grading

    grading.submit(course_root, student, lab, nb)
    run = grading.autograde(lab, course_root=course_root, cell_timeout=cell_timeout, timeout=lab_timeout,
                            force=False)
    return run, grading.cell_scores(course_root, lab, student)


def _error_lines(course_root: Path, student: str, lab: str) -> dict:
    """grade_id -> the error nbgrader recorded in the autograded notebook (or the stderr it scored as failed)."""
    import nbformat

    from lab_utils.grading.course import cell_meta

    path = course_root / "grader" / "work" / "autograded" / student / lab / f"{lab}.ipynb"
    if not path.is_file():
        return {}
    out = {}
    for cell in nbformat.read(str(path), as_version=4).cells:
        gid = cell_meta(cell).get("grade_id")
        if not gid or cell.get("cell_type") != "code":
            continue
        for o in cell.get("outputs", []):
            if o.get("output_type") == "error":
                first = (o.get("evalue") or "").strip().split("\n")
                out[gid] = f"{o.get('ename')}: " + " | ".join(line.strip() for line in first[:6] if line.strip())
                break
            if o.get("output_type") == "stream" and o.get("name") == "stderr":
                out.setdefault(gid, "wrote to stderr: " + o.get("text", "").strip().split("\n")[-1][:300])
    return out


def _nbgrader_error(output: str) -> str:
    """The lines of an nbgrader log that say why a submission has no autograded notebook."""
    keys = ("ERROR", "Error", "Timeout", "timed out", "died", "Dead")
    hits = [line.strip() for line in output.split("\n") if any(k in line for k in keys)]
    return " | ".join(hits[-4:])[-1200:] or "no autograded notebook; nbgrader log: " + \
        " | ".join(output.strip().split("\n")[-3:])


# ------------------------------------------------------------------------------------------ load
class busy_cores:
    """Context manager: `n` busy-loop processes (default: the CPU budget - 1, ``lab_utils.cgroups``: a quota's CPUs,
    not the machine's), always stopped on exit, even on ^C."""

    def __init__(self, n: int | None = None):
        self.n = max(0, cgroups.cpu_budget().cpus - 1) if n is None else max(0, int(n))
        self.procs: list = []

    def __enter__(self):
        for _ in range(self.n):
            self.procs.append(subprocess.Popen(
                [sys.executable, "-c", _BUSY, str(os.getpid())], stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self.procs = []
        return False


# The busy loop asks Linux to kill it when its parent dies, and checks its parent now and then anyway.
_BUSY = """
import os, sys, signal
parent = int(sys.argv[1])
if sys.platform.startswith("linux"):
    import ctypes
    ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)
if os.getppid() != parent:
    sys.exit(0)
n = 0
while True:
    n += 1
    if n % 20_000_000 == 0 and os.getppid() != parent:
        sys.exit(0)
"""


# ------------------------------------------------------------------------------------------ the command
def stress(labs=None, *, k: int = 10, busy: int | None = None, cell_timeout=None, lab_timeout: float = 1800,
           repo_root: Path | str | None = None, keep: bool = False, out=None) -> list:
    """Autograde each lab's solution `k` times with the other cores busy. Returns every StressRun."""
    from tqdm import tqdm

    from lab_utils import grading

    out = out or sys.stdout
    repo_root = grading.find_course_root(repo_root)
    labs = list(labs) if labs else grading.discover_labs(repo_root)
    unknown = [lab for lab in labs if lab not in grading.discover_labs(repo_root)]
    if unknown:
        raise grading.GradingError(f"no solutions/NN_topic/NN_topic.ipynb for {unknown}")
    runs = []
    scratch = Path(tempfile.mkdtemp(prefix="dtlabs-stress-"))
    try:
        with _under_load(busy, f"{len(labs)} lab(s) x {k} autograde runs", out):
            for lab in labs:
                root = scratch / lab
                nb = _prepare(lab, root, repo_root)
                bar = tqdm(range(1, k + 1), desc=lab, file=out, leave=True, dynamic_ncols=False, ncols=100)
                for i in bar:
                    student = STUDENT.format(i)
                    start = time.monotonic()
                    run, scores = _grade_once(lab, root, student, nb, cell_timeout, lab_timeout)
                    note = ""
                    if run.timed_out:
                        note = f"autograde ran past {lab_timeout:g} s"
                    elif not scores:
                        note = "not graded: " + " | ".join(run.output.strip().split("\n")[-3:])
                    (root / "logs").mkdir(exist_ok=True)
                    (root / "logs" / f"{student}.log").write_text(run.output)
                    r = StressRun(lab, i, scores, time.monotonic() - start, note=note)
                    if not r.full:
                        r.errors = _error_lines(root, student, lab)
                        if not r.errors and not r.note:  # no autograded notebook: nbgrader says why
                            r.note = _nbgrader_error(run.output)
                    runs.append(r)
                    got, total = r.points
                    bar.write(_line(r), file=out)
                    bar.set_postfix_str(f"{sum(x.full for x in runs if x.lab == lab)}/{i} full")
                bar.close()
    finally:
        if keep:
            print(f"scratch courses kept in {scratch}", file=out)
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    print(summary(runs), file=out, flush=True)
    return runs


def stress_tests(pytest_args, *, k: int = 10, busy: int | None = None, out=None) -> list:
    """Run a pytest selection `k` times in a row with the other cores busy (the project's own flakes: torchrun,
    launcher reliability, browser). Returns one (exit code, failed test ids, seconds) per run."""
    out = out or sys.stdout
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", *pytest_args]
    runs = []
    with _under_load(busy, f"{' '.join(pytest_args)} x {k} runs", out):
        for i in range(1, k + 1):
            start = time.monotonic()
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            failed = [line.split()[1] for line in proc.stdout.splitlines() if line.startswith(("FAILED ", "ERROR "))]
            runs.append((proc.returncode, failed, time.monotonic() - start))
            tail = proc.stdout.strip().splitlines()[-1:] or ["(no output)"]
            print(f"run {i}: exit {proc.returncode} in {runs[-1][2]:.0f} s: {tail[0]}", file=out, flush=True)
            for test in failed:
                print(f"    FAILED {test}", file=out, flush=True)
    good = sum(rc == 0 for rc, _, _ in runs)
    print(f"\nstress summary: {good}/{len(runs)} runs passed", file=out, flush=True)
    return runs


@contextlib.contextmanager
def _under_load(busy, what: str, out):
    """The other cores busy while the block runs, said in one line; SIGTERM stops it as ^C does (busy loops and
    scratch folders are cleaned up either way)."""
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        with busy_cores(busy) as load:
            print(f"stress: {what}, {load.n} busy-loop process(es) on a budget of {cgroups.cpu_budget().cpus} CPUs",
                  file=out, flush=True)
            yield load
    finally:
        signal.signal(signal.SIGTERM, previous)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def _line(r: StressRun) -> str:
    got, total = r.points
    head = f"{r.lab} run {r.index}: {got:g}/{total:g} in {r.seconds:.0f} s"
    if r.full:
        return head
    parts = [head + "  LOST POINTS" + (f" ({r.note})" if r.note else "")]
    for gid, (s, m) in r.lost.items():
        parts.append(f"    {gid} {s:g}/{m:g}: {r.errors.get(gid, '(no error output recorded)')}")
    return "\n".join(parts)


def summary(runs) -> str:
    labs = list(dict.fromkeys(r.lab for r in runs))
    rows = ["", "stress summary (full-mark runs / runs, seconds per run min-max):"]
    for lab in labs:
        mine = [r for r in runs if r.lab == lab]
        secs = [r.seconds for r in mine]
        rows.append(f"  {lab:24s} {sum(r.full for r in mine)}/{len(mine)}   {min(secs):.0f}-{max(secs):.0f} s")
    bad = [r for r in runs if not r.full]
    rows.append("every run got full marks" if not bad else f"{len(bad)} run(s) lost points:")
    rows += [_line(r) for r in bad]
    return "\n".join(rows)
