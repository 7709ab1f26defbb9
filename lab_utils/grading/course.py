"""Where a course keeps things: the repository layout that every grading step shares."""
from __future__ import annotations

import re
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
GRADER_DIR = REPO_ROOT / "grader"
WORK = Path("grader") / "work"  # relative to a course root, as in grader/nbgrader_config.py
LAB_ID = re.compile(r"^\d\d_[A-Za-z0-9_]+$")
SOLUTION_MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION")
HIDDEN_MARKERS = ("### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS")


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


class GradingError(RuntimeError):
    """An nbgrader step could not run at all (not: a submission failed, which is a grade)."""


def discover_labs(root: Path | str = REPO_ROOT) -> list[str]:
    """Assignment ids ``NN_topic`` that have ``solutions/NN_topic/NN_topic.ipynb``, sorted."""
    sol = Path(root) / "solutions"
    if not sol.is_dir():
        return []
    return sorted(
        d.name for d in sol.iterdir() if d.is_dir() and LAB_ID.match(d.name) and (d / f"{d.name}.ipynb").is_file()
    )


def submissions(course_root: Path | str) -> dict:
    """assignment id -> sorted student ids found in submitted/<student>/<assignment>/."""
    base = Path(course_root) / WORK / "submitted"
    found: dict = {}
    if base.is_dir():
        for student in sorted(p for p in base.iterdir() if p.is_dir()):
            for lab in sorted(p for p in student.iterdir() if p.is_dir()):
                found.setdefault(lab.name, []).append(student.name)
    return found
