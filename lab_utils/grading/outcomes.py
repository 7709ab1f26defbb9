"""What each grading run of a submission said, kept beside the gradebook: graded or not, why, and how long it took.

nbgrader's gradebook holds scores, but not a submission that could not be graded (nor the reason), nor the seconds
grading took; the class report needs both. ``dtlabs grade`` and ``dtlabs merge`` (the Slurm array's results) call
``note`` once per submission, after its sandbox is gone, into ``grader/work/grading-outcomes.json``
("lab/student" -> the latest run). The file is a convenience for reports: grades come only from the gradebook.
"""
from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from lab_utils.grading import gradebook

RECORD = "grading-outcomes.json"


def note(course_root: Path | str, lab: str, student: str, *, graded: bool, points=None, reasons=(),
         seconds: float | None = None) -> None:
    """Record the latest grading run of ``student``'s ``lab`` (it replaces the one before)."""
    data = gradebook.read_record(course_root, RECORD)
    data[f"{lab}/{student}"] = {
        "graded": bool(graded),
        "points": [float(points[0]), float(points[1])] if points else None,
        "reasons": [str(r) for r in reasons if r],
        "seconds": round(float(seconds), 2) if seconds is not None else None,
        "at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    gradebook.write_record(course_root, RECORD, data)


def of_lab(course_root: Path | str, lab: str) -> dict:
    """student -> the latest run's record, for one lab."""
    prefix = f"{lab}/"
    return {key[len(prefix):]: value for key, value in gradebook.read_record(course_root, RECORD).items()
            if key.startswith(prefix) and isinstance(value, dict)}
