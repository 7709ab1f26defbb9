"""Student ids at the door: the one rule every command applies to a name before it becomes a folder, a roster line,
a gradebook row or a CSV cell.

An id comes from a folder name (``--submissions``, an LMS export students can influence), a command line or a
roster. It names a student only if it is printable (no newline, tab, escape code or other control character: those
forge roster lines and CSV rows and draw on the instructor's terminal), has no path separator and is not ``.`` or
``..`` (it becomes a folder), has no space at either end (a roster line is stripped), does not begin with ``-``,
``=``, ``+`` or ``@`` (a command-line option, a spreadsheet formula) and is at most 128 characters (nbgrader's
column). Two ids that differ only in case (``Ann``, ``ann``) are one login to Canvas and one folder on a
case-insensitive disk: neither is graded, and each is reported with the other's name, because no program can tell
which of the two the grade belongs to; the instructor renames one. An id that breaks the rule is NOT GRADED and
never registered anywhere; it is only ever printed as ``shown`` renders it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

MAX_LEN = 128  # nbgrader's Student.id column
LEADING = "-=+@"


def problem(student: str) -> str | None:
    """Why ``student`` cannot name a student (for the NOT GRADED line), or None when it can."""
    if not student:
        return "an empty student id"
    if not student.isprintable():
        bad = next(ch for ch in student if not ch.isprintable())
        return f"the student id holds a control or unprintable character ({bad!r})"
    if "/" in student or "\\" in student or (os.altsep and os.altsep in student):
        return "the student id holds a path separator"
    if student in (".", ".."):
        return "the student id is a path component ('.' or '..')"
    if student != student.strip():
        return "the student id begins or ends with a space"
    if student[0] in LEADING:
        return f"the student id begins with {student[0]!r} (an option or a spreadsheet formula)"
    if len(student) > MAX_LEN:
        return f"the student id is longer than {MAX_LEN} characters"
    return None


def shown(student: str) -> str:
    """``student`` as it may be printed: as it is when it is a valid id, else escaped (``repr``), so no escape code
    or newline in it reaches the terminal or a log."""
    return student if problem(student) is None else repr(student)


def case_conflicts(students) -> dict:
    """student -> the reason, for every id that differs only in case from another of ``students``."""
    by_key: dict = {}
    for s in students:
        by_key.setdefault(s.casefold(), []).append(s)
    out = {}
    for group in by_key.values():
        if len(group) > 1:
            for s in group:
                others = ", ".join(repr(o) for o in group if o != s)
                out[s] = f"the student id differs only in case from {others}: rename one of them"
    return out


def refusals(students) -> dict:
    """student -> why it is refused, for every id of ``students`` that breaks the rule or collides in case."""
    out = {s: why for s in students if (why := problem(s))}
    out.update({s: why for s, why in case_conflicts([s for s in students if s not in out]).items()})
    return out


@dataclass
class Scan:
    """A class folder (``<student>/<lab>/``) read at the door."""

    found: dict = field(default_factory=dict)  # lab -> sorted valid student ids with a real folder of it
    refused: list = field(default_factory=list)  # (student as shown, lab or None, reason)


def scan(base: Path | str) -> Scan:
    """Who submitted what under ``base``: every student folder that is a real folder (not a link) this user can
    read, named by a valid id; every other entry is refused with the reason (never dropped without a word)."""
    base = Path(base)
    out = Scan()
    if not base.is_dir():
        return out
    entries = sorted(base.iterdir())
    bad = refusals([p.name for p in entries if p.is_dir() or p.is_symlink()])
    for student in entries:
        name = student.name
        if student.is_symlink():
            out.refused.append((shown(name), None, "the student folder is a symbolic link (not followed)"))
            continue
        if not student.is_dir():
            continue
        if name in bad:
            out.refused.append((shown(name), None, bad[name]))
            continue
        try:
            labs = sorted(student.iterdir())
        except OSError as exc:
            out.refused.append((name, None, f"the student folder cannot be read: {exc.strerror or exc}"))
            continue
        for lab in labs:
            if lab.is_symlink():
                out.refused.append((name, shown(lab.name), "the lab folder is a symbolic link (not followed)"))
            elif lab.is_dir():
                if not os.access(lab, os.R_OK | os.X_OK):
                    out.refused.append((name, shown(lab.name), "the lab folder cannot be read: permission denied"))
                    continue
                out.found.setdefault(lab.name, []).append(name)
    return out
