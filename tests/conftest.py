"""Shared fixtures: process-leak checks, a tiny synthetic nbgrader course, and lab timings in the summary.

Process leaks are counted only among processes *this test started*: the ``no_leaked_processes`` fixture puts
a fresh token in the environment, every process started during the test inherits it, and afterwards any
survivor carrying it (a rank ``dtlabs-rank*``, a ``dtlabs-zygote`` that is not this process's own warm one, a
torchrun agent or worker, a kernel) fails the test. Other people's notebooks on a shared machine are never
counted and never signalled.
"""
from __future__ import annotations

import os
import tempfile
import time
import uuid
from pathlib import Path

import psutil
import pytest

from lab_utils import grading
from lab_utils.status import Status

REPO = grading.REPO_ROOT
# The canary's kept verdicts: one folder per test run (pytest-xdist's workers share it), never the developer's own.
os.environ.setdefault("DTLABS_CACHE_DIR", os.path.join(
    tempfile.gettempdir(), f"dtlabs-test-cache-{os.environ.get('PYTEST_XDIST_TESTRUNUID') or uuid.uuid4().hex}"))
TEST_TOKEN_VAR = "DTLABS_TEST_TOKEN"  # not grading.TOKEN_VAR: grading sets its own token per nbgrader run
LAB_TIMINGS: dict = {}  # lab -> {"papermill_s": ..., "autograde_s": ...}, printed at the end of the run
LAB_POINTS: dict = {}  # lab -> {student: "earned/possible"} from autograde, printed at the end of the run


# ------------------------------------------------------------------------------------------ processes
def _describe(p) -> str:
    try:
        return f"pid {p.pid} {p.name()!r}: {' '.join(p.cmdline())[:160]}"
    except psutil.Error:
        return f"pid {p.pid} (gone)"


def is_rank_like(p) -> bool:
    """A rank, a zygote, a torchrun agent or an elastic worker."""
    try:
        name = p.name()
        if name.startswith("dtlabs-rank") or name == "dtlabs-zygote":
            return True
        cmd = " ".join(p.cmdline())
        if "torchrun" in cmd or "torch.distributed.run" in cmd or "torch.distributed.launch" in cmd:
            return True
        return "TORCHELASTIC_RUN_ID" in p.environ()
    except psutil.Error:
        return False


def leftover_processes(token: str, wait_s: float = 5.0) -> list:
    """Processes started under ``token`` still alive after ``wait_s``, except this process's own warm zygote."""
    me = os.getpid()
    deadline = time.monotonic() + wait_s
    while True:
        left = []
        for p in grading.processes_with_token(token, var=TEST_TOKEN_VAR):
            try:
                if p.ppid() == me and p.name() == "dtlabs-zygote":
                    continue  # launch() in this process keeps one warm fork server by design
            except psutil.Error:
                continue
            left.append(p)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def assert_no_leftovers(token: str, wait_s: float = 5.0) -> None:
    """Fail (after killing them) if anything started under ``token`` survives; ranks are named first."""
    left = leftover_processes(token, wait_s)
    if left:
        ranks = [p for p in left if is_rank_like(p)]
        desc = "\n  ".join(_describe(p) for p in (ranks or left))
        grading.reap(token, var=TEST_TOKEN_VAR)
        kind = "rank/zygote/torchrun process(es)" if ranks else "process(es)"
        raise AssertionError(f"{len(ranks or left)} {kind} survived the test:\n  {desc}")


@pytest.fixture
def process_token(monkeypatch):
    """A fresh token in this test's environment; every process the test starts inherits it."""
    token = uuid.uuid4().hex
    monkeypatch.setenv(TEST_TOKEN_VAR, token)
    return token


@pytest.fixture
def no_leaked_processes(process_token):
    """Use in any test that starts ranks, kernels or torchrun: it fails if one of them outlives the test."""
    yield process_token
    assert_no_leftovers(process_token)


# ------------------------------------------------------------------------------------------ a synthetic course
SYNTHETIC_LAB = "00_synthetic"
HIDDEN_SOURCE = "add(-1, 1) == 0 and add(0.5, 0.25) == 0.75"  # must never reach a student


def make_synthetic_course(root: Path) -> Path:
    """A course with one tiny lab (no torch: seconds to grade) shaped like AUTHORING.md asks.

    ``add`` is the solution cell; ``test_add`` (2 points) has a visible and a hidden check (the hidden one's
    source line is HIDDEN_SOURCE, so tests can look for leaks); ``test_twice`` (1 point) checks ``twice``.
    The known-wrong ``ignores_sign`` passes the visible check and fails only the hidden one.
    """
    import nbformat
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

    def meta(gid, **kw):
        return {"nbgrader": {"schema_version": 3, "grade_id": gid, **kw}}

    cells = [
        new_markdown_cell("# Synthetic lab\nAfter this lab you can add two numbers.", id="intro"),
        new_code_cell(
            'WORLD_SIZE = 2\nBACKEND = "auto"\nSTEPS = 1\nSEED = 0', id="parameters",
            metadata={"tags": ["parameters"], **meta("parameters", grade=False, solution=False, locked=True)},
        ),
        new_code_cell(
            "def add(a, b):\n    ### BEGIN SOLUTION\n    return a + b\n    ### END SOLUTION\n\n\n"
            "def twice(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION",
            id="add-solution", metadata=meta("add", grade=False, solution=True, locked=False),
        ),
        new_code_cell(
            "assert add(1, 2) == 3, 'add(1, 2) should be 3'\n"
            "### BEGIN HIDDEN TESTS\n"
            f"assert {HIDDEN_SOURCE}, 'add is wrong for negative or fractional numbers'\n"
            "### END HIDDEN TESTS",
            id="test-add", metadata=meta("test_add", grade=True, solution=False, locked=True, points=2),
        ),
        new_code_cell(
            "assert twice(3) == 6, 'twice(3) should be 6'", id="test-twice",
            metadata=meta("test_twice", grade=True, solution=False, locked=True, points=1),
        ),
        new_markdown_cell("## Summary\nYou added numbers. Why does the order not matter?", id="summary"),
    ]
    nb = new_notebook(cells=cells, metadata={
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python"},
    })
    d = Path(root) / "solutions" / SYNTHETIC_LAB
    d.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(d / f"{SYNTHETIC_LAB}.ipynb"))
    kw = Path(root) / "grader" / "known_wrong" / SYNTHETIC_LAB
    kw.mkdir(parents=True, exist_ok=True)
    (kw / "ignores_sign.py").write_text(
        "# replaces: add\n# loses: test_add\n# mistake: adds absolute values (right only for positive numbers)\n"
        "def add(a, b):\n    return abs(a) + abs(b)\n\n\ndef twice(x):\n    return 2 * x\n"
    )
    return Path(root)


@pytest.fixture(scope="session")
def synthetic_course(tmp_path_factory):
    """A released synthetic course (gradebook filled); copy it before grading into it."""
    root = make_synthetic_course(tmp_path_factory.mktemp("synthetic-course"))
    grading.release([SYNTHETIC_LAB], root=root)
    return root


# ------------------------------------------------------------------------------------------ timings
def record_lab(node, lab: str, timings: dict | None = None, points: dict | None = None) -> None:
    """Note a lab's timings/points on the test's report, so the summary has them with or without xdist workers."""
    if timings:
        node.user_properties.append(("lab_timings", (lab, dict(timings))))
    if points:
        node.user_properties.append(("lab_points", (lab, dict(points))))


def pytest_runtest_logreport(report):
    for name, value in getattr(report, "user_properties", ()):
        if name == "lab_timings":
            LAB_TIMINGS.setdefault(value[0], {}).update(value[1])
        elif name == "lab_points":
            LAB_POINTS.setdefault(value[0], {}).update(value[1])


def pytest_terminal_summary(terminalreporter):
    if LAB_TIMINGS:
        terminalreporter.section("lab timings (seconds)")
        for lab, t in sorted(LAB_TIMINGS.items()):
            parts = ", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in sorted(t.items()))
            terminalreporter.write_line(f"{lab}: {parts}")
    if LAB_POINTS:
        terminalreporter.section("lab points (autograde; known-wrong: on the cells each must lose)")
        for lab, students in sorted(LAB_POINTS.items()):
            terminalreporter.write_line(f"{lab}:")
            for student, points in students.items():
                terminalreporter.write_line(f"    {student}: {points}")


# ------------------------------------------------------------------------------------------ a graded class
LATE_POLICY = '''
import math
from nbgrader.plugins import LateSubmissionPlugin


class OnePointPerStartedDay(LateSubmissionPlugin):
    """The course's late policy: one point per started day past the due date."""

    def late_submission_penalty(self, student_id, score, total_seconds_late):
        return float(math.ceil(total_seconds_late / 86400))


c.AssignLatePenalties.plugin_class = OnePointPerStartedDay
c.DTLabs.due_dates = {"00_synthetic": "2030-01-10 12:00:00 UTC"}
'''
CLASS = {  # student -> (what they submitted, timestamp.txt or None, how it is graded)
    "ann": ("solution", "2030-01-09 10:00:00 UTC", "grade"),
    "cat": ("ignores_sign", "2030-01-10 11:00:00 UTC", "grade"),
    "dan": ("unreadable", None, "grade"),
    "eve": ("solution", "2030-01-10 18:00:00 UTC", "grade"),  # 6 hours late: one point
    "bob": ("release", None, "grade-one"),  # graded as a Slurm array task, then merged
}


@pytest.fixture(scope="session")
def graded_class(tmp_path_factory):
    """The synthetic course with a late policy in its config, and a class graded by `dtlabs grade` (four students)
    and `dtlabs grade-one` + `dtlabs merge` (bob): what the exports and the report are built from. Read only."""
    import shutil

    import nbformat
    from known_wrong import read_known_wrong

    from lab_utils import cli

    base = tmp_path_factory.mktemp("graded-class")
    root = make_synthetic_course(base / "course")
    (root / "grader" / "nbgrader_config.py").write_text((REPO / "grader" / "nbgrader_config.py").read_text()
                                                        + LATE_POLICY)
    grading.release([SYNTHETIC_LAB], root=root)
    rel = nbformat.read(str(root / "labs" / SYNTHETIC_LAB / f"{SYNTHETIC_LAB}.ipynb"), as_version=4)
    src = nbformat.read(str(root / "solutions" / SYNTHETIC_LAB / f"{SYNTHETIC_LAB}.ipynb"), as_version=4)
    wrong = read_known_wrong(root / "grader" / "known_wrong" / SYNTHETIC_LAB / "ignores_sign.py")
    answers = {"solution": grading.fill_solutions(rel, src), "release": rel,
               "ignores_sign": grading.fill_solutions(rel, src, {wrong.replaces: wrong.source})}
    inbox, array = base / "inbox", base / "array"
    for student, (what, stamp, how) in CLASS.items():
        folder = (inbox if how == "grade" else array) / student / SYNTHETIC_LAB
        folder.mkdir(parents=True)
        if what == "unreadable":
            (folder / f"{SYNTHETIC_LAB}.ipynb").write_text("{ this is not a notebook")
        else:
            nbformat.write(answers[what], str(folder / f"{SYNTHETIC_LAB}.ipynb"))
    # the submission times come from the instructor (the LMS's), never from a student's own timestamp.txt
    times = base / "times.csv"
    times.write_text("student,timestamp\n" + "".join(f"{s},{stamp}\n" for s, (_, stamp, how) in CLASS.items()
                                                      if stamp and how == "grade"))
    lines = []
    code = grading.grade([SYNTHETIC_LAB], course_root=root, submissions_dir=inbox, feedback=False, out=lines.append,
                         progress=False, timestamps=times)
    assert code is Status.INCOMPLETE, "dan's notebook is unreadable: grade must say so\n" + "\n".join(lines)
    shutil.copytree(array, root / "grader" / "work" / "submitted", dirs_exist_ok=True)
    results = base / "results"
    array_students = [s for s, (*_, how) in CLASS.items() if how == "grade-one"]
    assert cli.main(["prepare-array", SYNTHETIC_LAB, *array_students, "--out", str(results),
                     "--course-root", str(root)]) == 0
    for task in range(len(array_students)):
        assert cli.main(["grade-one", SYNTHETIC_LAB, "--task", str(task), "--out", str(results),
                         "--course-root", str(root)]) == 0
    assert cli.main(["merge", str(results), "--course-root", str(root)]) == 0
    shutil.rmtree(results)
    return root


# What the longest groups and tests took in `make test` (seconds, 2 cores, 4 workers; a group's tests summed).
# pytest-xdist's loadgroup hands out work in collection order, so the longest go first (longest-processing-time-first)
# and no worker starts a five-minute group when the others are nearly done. Only the order changes; an unlisted test
# keeps its place.
EXPECTED_S = {
    "lab-10_3d_frameworks": 191, "gradescope": 161, "cheats-bwrap-00_synthetic": 118, "lab-05_multi_node": 110,
    "cheats-bwrap-01_ddp_setup": 109, "lab-01_ddp_setup": 102, "lab-03_fsdp_zero": 97, "cheats-fallback-": 96,
    "lab-09_async_elastic": 89, "test_solution_runs_under_papermill[05_": 85,
    "test_solution_runs_under_papermill[10_": 83, "lab-07_model_parallel": 77,
    "test_solution_runs_under_papermill[09_": 56, "graded-class": 54, "lab-08_comm_efficiency": 53,
    "test_merge_job_on_a_gradebook": 39, "test_grade_batch_survives_broken_and_hanging": 39, "lab-11_gpu_kernels": 80,
}


def _expected_s(item) -> float:
    mark = item.get_closest_marker("xdist_group")
    group = (mark.args[0] if mark and mark.args else mark.kwargs.get("name", "")) if mark else ""
    return max((s for key, s in EXPECTED_S.items() if group.startswith(key) or key in item.nodeid), default=0)


def pytest_collection_modifyitems(config, items):
    if getattr(config.option, "numprocesses", None):
        items.sort(key=_expected_s, reverse=True)  # stable: equal weights keep their collection order
