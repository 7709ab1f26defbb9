"""What each grading run of a submission said: its reasons, typed by whose they are, and the record of every run.

A ``Reason`` is made where grading learns something (the sandbox, nbgrader's log, the batch) with its ``Kind``:
the student's (it costs points or is said on the grade line), the environment's (the grading machine cannot grade:
never a grade, and the class waits for the canary), the course's (the grading code failed on this submission:
NOT GRADED, the class goes on), or unprotected (graded without a boundary, by name; or as the separate user with
the network open, ``network_open``). Code that decides reads the
kind; ``str(reason)`` is the text a grade line, a record and results.json show, and ``Reason.parse`` reads that text
back where it crossed a process in a file (the subject's report, a job-array result).

nbgrader's gradebook holds scores, but not a submission that could not be graded (nor the reason), nor the seconds
grading took; the class report needs both. ``dtlabs grade`` and ``dtlabs merge`` (the Slurm array's results) call
``note`` once per submission, after its sandbox is gone, into ``grader/work/grading-outcomes.json``
("lab/student" -> the latest run). The file is a convenience for reports: grades come only from the gradebook.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from lab_utils.grading import gradebook

RECORD = "grading-outcomes.json"


class Kind(enum.Enum):
    """Whose a reason is, which decides what grading does with the submission."""

    STUDENT = "student"
    ENVIRONMENT = "environment"
    COURSE = "course"
    UNPROTECTED = "unprotected"


ENVIRONMENT_MARK = "environment: "  # how an environment's reason reads (after its ``where``)
WHERES = ("sandbox",)  # the parts of grading that name themselves first on a reason they give


@dataclass(frozen=True)
class Reason:
    """One thing a grading run said about a submission: whose it is (``kind``), its words, and which part of grading
    said it (``where``, shown first)."""

    kind: Kind
    text: str
    where: str = ""

    def __str__(self) -> str:
        head = f"{self.where}: " if self.where else ""
        return head + (ENVIRONMENT_MARK if self.kind is Kind.ENVIRONMENT else "") + self.text

    @classmethod
    def parse(cls, line: str) -> Reason:
        """The reason whose text is ``line`` (``str`` of one; the inverse of it): an environment's by its mark at the
        start, the unprotected mode's by its whole words, every other one the student's."""
        where, rest = "", line
        for name in WHERES:
            if line.startswith(f"{name}: "):
                where, rest = name, line[len(name) + 2:]
                break
        if rest.startswith(ENVIRONMENT_MARK):
            return cls(Kind.ENVIRONMENT, rest[len(ENVIRONMENT_MARK):], where)
        if rest == UNPROTECTED.text or rest.startswith(NETWORK_OPEN + " ("):
            return cls(Kind.UNPROTECTED, rest, where)
        return cls(Kind.STUDENT, rest, where)

    @classmethod
    def of(cls, reason: Reason | str) -> Reason:
        return reason if isinstance(reason, Reason) else cls.parse(str(reason))


UNPROTECTED = Reason(Kind.UNPROTECTED, "taken without a boundary (--unprotected)")  # on every grade of that mode
NETWORK_OPEN = "the submission had the network"  # as the separate user, where boundary/network.py could not close it


def network_open(why: str) -> Reason:
    return Reason(Kind.UNPROTECTED, f"{NETWORK_OPEN} ({why})")


def of_kind(reasons, kind: Kind) -> list[Reason]:
    """The reasons of ``reasons`` (Reasons, or their text) that are of ``kind``."""
    return [r for r in map(Reason.of, reasons) if r.kind is kind]


def note(course_root: Path | str, lab: str, student: str, *, graded: bool, points=None, reasons=(),
         seconds: float | None = None) -> None:
    """Record the latest grading run of ``student``'s ``lab`` (it replaces the one before)."""
    data = gradebook.read_record(course_root, RECORD)
    data[f"{lab}/{student}"] = {
        "graded": bool(graded),
        "points": [float(points[0]), float(points[1])] if points else None,
        "reasons": [str(r) for r in reasons if r],  # a Reason's text, as every grade line shows it
        "seconds": round(float(seconds), 2) if seconds is not None else None,
        "at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    gradebook.write_record(course_root, RECORD, data)


def of_lab(course_root: Path | str, lab: str) -> dict:
    """student -> the latest run's record, for one lab."""
    prefix = f"{lab}/"
    return {key[len(prefix):]: value for key, value in gradebook.read_record(course_root, RECORD).items()
            if key.startswith(prefix) and isinstance(value, dict)}
