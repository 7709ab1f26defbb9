"""Grading is right wherever a course is installed: Lab 01's good, empty and known-wrong submissions graded as the
instructor (an ordinary user), from a course under /tmp whose folder name has a space and a non-ASCII letter.

The three layouts of a grading host:
- (a) the course's own venv from ``make install`` (editable), bubblewrap: the ``course`` fixture is that layout, and
  tests/deploy/test_slurm.py grades a class in it (good, empty, known-wrong, a cheat, a hanging cell) with
  ``dtlabs grade --jobs 2`` and as a Slurm array, with the same assertions as here;
- (b) a plain ``pip install`` of the wheel into a separate venv (its path with a space too), no editable package;
- (c) unprotected (``DTLABS_SANDBOX=off``, the instructor's choice by name), as on a host without bubblewrap.
Each must give full marks / 0 / less than full, behind the lab's canary, with exit code 0 and nothing NOT GRADED.
"""
from __future__ import annotations

import json
import shlex
import subprocess
import time
from pathlib import Path

import nbformat
import pytest

from deploy_helpers import APART, COURSE_PARENT, REPO, SYSTEM_PYTHON, TEACHER, TIMINGS, TORCH_SPEC, copy_course, \
    run_as, teacher_env

from lab_utils import grading

pytestmark = [pytest.mark.deploy, pytest.mark.xdist_group(APART)]  # each in its own copy; which worker: conftest.py
LAB = "01_ddp_setup"
WRONG = "no_divide_by_world_size.py"


@pytest.fixture(scope="module")
def layout_course(course) -> Path:
    """A second copy of the course (its tracked files, no venv) beside the first, with a class of three."""
    dest = COURSE_PARENT / "layout course"
    copy_course(dest, TEACHER)
    from helpers.known_wrong import read_known_wrong

    rel = nbformat.read(str(dest / "labs" / LAB / f"{LAB}.ipynb"), as_version=4)
    src = nbformat.read(str(dest / "solutions" / LAB / f"{LAB}.ipynb"), as_version=4)
    wrong = read_known_wrong(REPO / "grader" / "known_wrong" / LAB / WRONG)
    inbox = COURSE_PARENT / "inbox ü"
    subprocess.run(["rm", "-rf", str(inbox)], check=True)
    for student, nb in (("good", grading.fill_solutions(rel, src)), ("empty", rel),
                        ("wrong", grading.fill_solutions(rel, src, {wrong.replaces: wrong.source}))):
        folder = inbox / student / LAB
        folder.mkdir(parents=True)
        nbformat.write(nb, str(folder / f"{LAB}.ipynb"))
    subprocess.run(["chown", "-R", f"{TEACHER}:", str(dest), str(inbox)], check=True)
    return dest


def _grade(python: Path, course: Path, what: str, **env) -> dict:
    """``dtlabs grade`` of the class from ``python``'s venv, on a course that has graded nothing; student -> points."""
    run_as(TEACHER, f"rm -rf {shlex.quote(str(course / 'grader' / 'work'))}", cwd=course)
    dtlabs = python.parent / "dtlabs"
    t0 = time.monotonic()
    res = run_as(TEACHER, [dtlabs, "grade", LAB, "--submissions", COURSE_PARENT / "inbox ü", "--no-feedback",
                           "--course-root", course], cwd=course,
                 env={**teacher_env(course, **env), "PATH": f"{python.parent}:/usr/local/bin:/usr/bin:/bin"},
                 check=False, timeout=900)
    TIMINGS[f"layout {what}: canary + 3 Lab 01 submissions"] = time.monotonic() - t0
    assert res.returncode == 0, f"{what}: dtlabs grade exited {res.returncode}\n{res.stdout[-4000:]}\n{res.stderr[-3000:]}"
    assert "NOT GRADED" not in res.stdout, res.stdout
    code = ("import json, sys\nfrom lab_utils import grading\n"
            f"print(json.dumps({{s: grading.cell_scores(sys.argv[1], {LAB!r}, s) for s in ('good', 'empty', 'wrong')}}))")
    out = run_as(TEACHER, [python, "-c", code, course], cwd=course, env=teacher_env(course))
    cells = json.loads(out.stdout)
    points = {s: (sum(v[0] for v in c.values()), sum(v[1] for v in c.values())) for s, c in cells.items()}
    TIMINGS[f"layout {what}: points good/empty/wrong"] = " ".join(f"{g:g}/{m:g}" for g, m in points.values())
    good, empty, wrong = points["good"], points["empty"], points["wrong"]
    assert good[1] > 0 and good[0] == good[1], f"{what}: the solution got {good}\n{res.stdout[-3000:]}"
    assert empty == (0, good[1]), f"{what}: the empty release got {empty}\n{res.stdout[-3000:]}"
    assert 0 < wrong[0] < wrong[1], f"{what}: the known-wrong answer got {wrong}\n{res.stdout[-3000:]}"
    return points


@pytest.mark.timeout(900)
def test_a_plain_wheel_install_in_a_separate_venv(course, layout_course):
    """(b) ``pip install`` of the built wheel (not editable) into its own venv: it must be able to grade."""
    venv, dist = COURSE_PARENT / "wheel venv", COURSE_PARENT / "dist"
    run_as(TEACHER, f"rm -rf {shlex.quote(str(venv))} {shlex.quote(str(dist))}", cwd=layout_course)
    t0 = time.monotonic()
    run_as(TEACHER, [course / ".venv" / "bin" / "python", "-m", "pip", "wheel", "-q", "--no-deps",
                     "--no-build-isolation", "-w", dist, layout_course], cwd=layout_course, timeout=300)
    wheel = next(dist.glob("*.whl"))
    run_as(TEACHER, [SYSTEM_PYTHON, "-m", "venv", venv], cwd=layout_course)
    py = venv / "bin" / "python"
    run_as(TEACHER, [py, "-m", "pip", "install", "-q", TORCH_SPEC], cwd=layout_course, timeout=600)
    run_as(TEACHER, [py, "-m", "pip", "install", "-q", wheel], cwd=layout_course, timeout=600)
    TIMINGS["layout (b): wheel built and installed in a fresh venv"] = time.monotonic() - t0
    where = run_as(TEACHER, [py, "-c", "import lab_utils.grading.split.execute, lab_utils; print(lab_utils.__file__)"],
                   cwd="/").stdout.strip()
    assert where.startswith(str(venv)), f"the wheel's package should be imported, not {where}"
    _grade(py, layout_course, "(b) wheel in a separate venv, bubblewrap")


@pytest.mark.timeout(900)
def test_the_fallback_sandbox(course, layout_course):
    """(c) unprotected (``DTLABS_SANDBOX=off``): the same grades, with the limits and the course guard."""
    _grade(course / ".venv" / "bin" / "python", layout_course, "(c) unprotected (DTLABS_SANDBOX=off)",
           DTLABS_SANDBOX="off")
