"""Where a course keeps things: its folder, its layout, its labs and their markers.

A course is a folder with ``solutions/`` (the nbgrader source) and ``grader/nbgrader_config.py``, wherever it lives
(a home folder, /tmp, a path with spaces) and however this package was installed (editable from the course's own
checkout, or ``pip install`` into a shared venv). ``find_course_root`` says which folder a command works on.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from lab_utils import processes
from lab_utils.status import Refused

WORK = Path("grader") / "work"  # relative to a course root
CONFIG = Path("grader") / "nbgrader_config.py"
LAB_ID = re.compile(r"^\d\d_[A-Za-z0-9_]+$")
SOLUTION_MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION")
HIDDEN_MARKERS = ("### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS")


class GradingError(Refused):
    """An nbgrader step could not run at all (not: a submission failed, which is a grade)."""


def is_course(path: Path | str) -> bool:
    path = Path(path)
    return (path / "solutions").is_dir() and (path / CONFIG).is_file()


# The checkout this package was imported from, when it is a course (an editable install, a test run); else None.
REPO_ROOT = processes.PACKAGE_DIR.parent if is_course(processes.PACKAGE_DIR.parent) else None


def find_course_root(explicit: Path | str | None = None, start: Path | str | None = None) -> Path:
    """The course a command works on: ``explicit`` (``--course-root``), else ``c.DTLabs.course_root`` /
    ``DTLABS_COURSE_ROOT``, else the nearest course at or above ``start`` (the working directory), else the checkout
    this package was installed from. ``GradingError`` if there is none, saying how to name one."""
    from lab_utils import settings

    named = explicit or settings.load().course_root
    if named:  # named by the instructor: taken as it is (a new course may have no lab yet)
        root = Path(named).expanduser().resolve()
        if not root.is_dir():
            raise GradingError(f"no course folder at {root}")
        return root
    here = Path(start or os.getcwd()).resolve()
    for folder in (here, *here.parents):
        if is_course(folder):
            return folder
    if REPO_ROOT is not None:
        return REPO_ROOT
    raise GradingError(f"no course at or above {here}: run dtlabs in the course folder (the one with solutions/ and "
                       "grader/nbgrader_config.py) or pass --course-root DIR")


def cell_meta(cell) -> dict:
    """A cell's nbgrader metadata (grade_id, grade, solution, locked, points), {} for a cell without."""
    return cell.get("metadata", {}).get("nbgrader", {})


def split_hidden(source: str) -> tuple[list[str], list[str]]:
    """(lines outside, lines inside) a cell's hidden-test region; the marker lines belong to neither."""
    visible, hidden, inside = [], [], False
    for line in source.split("\n"):
        if HIDDEN_MARKERS[0] in line:
            inside = True
        elif HIDDEN_MARKERS[1] in line:
            inside = False
        else:
            (hidden if inside else visible).append(line)
    return visible, hidden


def discover_labs(root: Path | str | None = None) -> list[str]:
    """Assignment ids ``NN_topic`` that have ``solutions/NN_topic/NN_topic.ipynb``, sorted."""
    sol = Path(root or find_course_root()) / "solutions"
    if not sol.is_dir():
        return []
    return sorted(
        d.name for d in sol.iterdir() if d.is_dir() and LAB_ID.match(d.name) and (d / f"{d.name}.ipynb").is_file()
    )


def submissions(course_root: Path | str) -> dict:
    """assignment id -> sorted student ids found in submitted/<student>/<assignment>/: only real folders named by a
    valid student id (``boundary.ids.scan`` says why each other one is refused)."""
    from lab_utils.grading.boundary import ids

    return ids.scan(Path(course_root) / WORK / "submitted").found
