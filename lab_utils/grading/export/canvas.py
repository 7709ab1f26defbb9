"""Grades into Canvas: an nbgrader ``ExportPlugin`` that writes the CSV Canvas's gradebook import (Grades > Import)
accepts, for the students of a roster.

The roster is the course's own Canvas gradebook export (Grades > Export): its columns ``Student, ID, SIS User ID,
SIS Login ID, Section`` name each student as Canvas knows them, and its assignment columns carry Canvas's titles
(``Lab 01 (12345)``). The export keeps those five columns, adds one column per lab titled as in the roster
(``c.DTLabs.canvas_columns``, else the roster's column named after the lab, else ``NN_topic``, which Canvas's import
offers to create as a new assignment), then Canvas's ``Points Possible`` row, then one row per roster student.
Students are matched by login: the gradebook's student id is the roster's ``SIS Login ID`` (case aside). A
gradebook id that breaks the id rule or differs from another only in case (``boundary.ids``) is skipped and named;
the rest of the class is exported. Every field is quoted and formula-safe (``csvfile``).

Each score is nbgrader's after its late-submission penalty (``late``), as in nbgrader's own CSV. Nothing is
dropped silently; on stderr: students in the gradebook but not in the roster (not in the file: Canvas could not
place them), roster students with no gradebook entry, submissions that were NOT GRADED (``outcomes``) and labs
without a submission (their cells are left blank, which Canvas's import leaves unchanged), and late penalties.

    nbgrader export --exporter=lab_utils.grading.export.canvas.CanvasExporter \\
        --CanvasExporter.roster=roster.csv --to=canvas.csv        (JUPYTER_CONFIG_PATH=grader)
    dtlabs export canvas --roster roster.csv --out canvas.csv
"""
from __future__ import annotations

import csv
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from nbgrader.plugins import ExportPlugin
from traitlets import Unicode

IDENTITY = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
LOGIN = "SIS Login ID"
POINTS_ROW = "    Points Possible"  # as Canvas writes it in its own exports
CANVAS_ID = re.compile(r"\s*\(\d+\)\s*$")  # "Lab 01 (12345)": the assignment id Canvas appends to a title


class RosterError(ValueError):
    """The roster is not a Canvas gradebook export this exporter can use."""


@dataclass
class Roster:
    columns: list
    students: list = field(default_factory=list)  # dicts with the IDENTITY keys


def read_roster(path: Path | str) -> Roster:
    """A Canvas gradebook export: its columns, and its student rows (Canvas's "Points Possible" and posting-policy
    rows left out)."""
    path = Path(path)
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:  # Canvas writes a byte-order mark
            rows = list(csv.reader(fh))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise RosterError(f"cannot read the roster {path}: {exc}") from None
    if not rows:
        raise RosterError(f"the roster {path} is empty")
    columns = [c.strip() for c in rows[0]]
    missing = [c for c in IDENTITY if c not in columns]
    if missing:
        raise RosterError(f"the roster {path} is not a Canvas gradebook export: no column {', '.join(missing)} "
                          f"(it has: {', '.join(columns[:8])}); export it from Canvas: Grades > Export")
    where = {c: columns.index(c) for c in IDENTITY}
    roster = Roster(columns)
    seen: dict = {}
    for n, row in enumerate(rows[1:], start=2):
        student = {c: (row[i].strip() if i < len(row) else "") for c, i in where.items()}
        if "points possible" in student["Student"].lower() or not (student["Student"] or student["ID"] or
                                                                   student[LOGIN]):
            continue
        key = student[LOGIN].casefold()
        if key and key in seen:
            raise RosterError(f"the roster {path} names the SIS Login ID {student[LOGIN]!r} twice (rows {seen[key]} "
                              f"and {n})")
        seen[key] = n
        roster.students.append(student)
    return roster


def column_title(lab: str, roster_columns: list, titles: dict) -> str:
    """The Canvas column for ``lab``: the configured title or the lab id, as the roster spells it (with Canvas's
    assignment id) when it has that column, else as it is (a new assignment in Canvas)."""
    wanted = titles.get(lab) or lab
    for col in roster_columns:
        if col == wanted or CANVAS_ID.sub("", col) == CANVAS_ID.sub("", wanted):
            return col
    return wanted


def _number(x: float) -> str:
    return f"{round(float(x), 2):g}"


class CanvasExporter(ExportPlugin):
    """nbgrader ExportPlugin: the gradebook as a Canvas gradebook import CSV (module docstring)."""

    roster = Unicode("", help="The course's Canvas gradebook export (CSV): which students, and the columns' "
                              "titles.").tag(config=True)
    course_root = Unicode("", help="The course whose grading record (grader/work/grading-outcomes.json) names the "
                                   "submissions that were NOT GRADED; empty: nbgrader's course directory.")

    def _root(self) -> Path | None:
        if self.course_root:
            return Path(self.course_root)
        coursedir = getattr(self.parent, "coursedir", None)
        return Path(coursedir.root) if coursedir is not None else None

    def _say(self, text: str) -> None:
        print(text, file=sys.stderr)

    def export(self, gradebook) -> None:
        from nbgrader.api import MissingEntry

        from lab_utils import settings
        from lab_utils.grading import outcomes
        from lab_utils.grading.boundary import ids
        from lab_utils.grading.export import csvfile

        if not self.roster:
            raise RosterError("no roster: pass --CanvasExporter.roster=ROSTER.csv (Canvas: Grades > Export)")
        roster = read_roster(self.roster)
        dest = Path(self.to or "canvas.csv")
        known = [a.name for a in gradebook.assignments]
        labs = [str(a) for a in self.assignment] or sorted(known)
        unknown = [lab for lab in labs if lab not in known]
        if unknown:
            raise RosterError(f"no such lab in the gradebook: {', '.join(unknown)} (it holds: {', '.join(known)})")
        if not labs:
            raise RosterError("the gradebook holds no lab yet: grade first (dtlabs grade)")
        titles = settings.load(self.config).canvas_columns
        header = IDENTITY + [column_title(lab, roster.columns, titles) for lab in labs]
        if len(set(header)) != len(header):
            raise RosterError(f"two labs would share a Canvas column: {header[len(IDENTITY):]} (c.DTLabs.canvas_columns)")
        wanted = {str(s) for s in self.student}  # --student: only these (roster rows of others are left out)
        students = {s.id: s for s in gradebook.students}
        # an id that breaks the rule, or differs from another only in case (one Canvas login), is skipped and named
        refused = ids.refusals(list(students))
        by_login = {sid.casefold(): sid for sid in students if sid not in refused}
        skipped = {sid.casefold() for sid in refused}
        root = self._root()
        record = {lab: outcomes.of_lab(root, lab) if root else {} for lab in labs}

        def cell(sid: str, lab: str) -> tuple[str, str | None]:
            """(the CSV's value, a note for stderr or None)."""
            run = record[lab].get(sid)
            if run and not run.get("graded"):
                return "", f"NOT GRADED, left blank: {sid}/{lab} ({'; '.join(run.get('reasons') or []) or 'no reason'})"
            try:
                sub = gradebook.find_submission(lab, sid)
            except MissingEntry:
                return "", None
            penalty = float(sub.late_submission_penalty or 0.0)
            score = max(0.0, float(sub.score or 0.0) - penalty)
            note = (f"late: {sid}/{lab} {_number(sub.score)} - {_number(penalty)} late penalty = {_number(score)}"
                    if penalty else None)
            return _number(score), note

        notes, blank, matched = [], {lab: 0 for lab in labs}, set()
        rows = [header, [POINTS_ROW, "", "", "", ""] + [_number(gradebook.find_assignment(lab).max_score)
                                                       for lab in labs]]
        not_in_gradebook = []
        for student in roster.students:
            sid = by_login.get(student[LOGIN].casefold()) if student[LOGIN] else None
            if wanted and sid not in wanted:
                continue
            values = []
            for lab in labs:
                value, note = cell(sid, lab) if sid else ("", None)
                values.append(value)
                if note:
                    notes.append(note)
                elif sid and value == "":
                    blank[lab] += 1
            if sid:
                matched.add(sid)
            elif student[LOGIN].casefold() not in skipped:  # a skipped id's row stays, blank, and is named below
                not_in_gradebook.append(student["Student"] or student[LOGIN] or student["ID"])
            rows.append([student[c] for c in IDENTITY] + values)
        csvfile.write(dest, rows)

        for sid, why in sorted(refused.items()):
            if not wanted or sid in wanted:
                self._say(f"SKIPPED, not in {dest.name}: the gradebook's student {ids.shown(sid)} ({why})")
        extra = sorted((wanted & set(students) if wanted else set(students)) - matched - set(refused))
        if extra:
            self._say(f"in the gradebook but not in the roster (NOT in {dest.name}: no SIS Login ID matches them; "
                      "add them to Canvas or fix their id): " + ", ".join(
                          f"{sid} ({', '.join(f'{lab} {cell(sid, lab)[0] or chr(8212)}' for lab in labs)})"
                          for sid in extra))
        if not_in_gradebook:
            self._say(f"in the roster but not in the gradebook (their cells left blank): {', '.join(not_in_gradebook)}")
        for lab in labs:
            if blank[lab]:
                self._say(f"{lab}: {blank[lab]} roster student(s) with no submission (cells left blank)")
        for note in notes:
            self._say(note)
        self.log.info("Canvas gradebook CSV: %s (%d students, labs %s)", dest, len(roster.students), ", ".join(labs))


def main(roster, out, *, labs=None, course_root=None):
    """``dtlabs export canvas``: the plugin run in this process on the course's gradebook, with its config: DONE, or
    REFUSED with the reason on stderr."""
    from nbgrader.api import Gradebook

    from lab_utils.grading import gradebook
    from lab_utils.grading.course import WORK, find_course_root
    from lab_utils.grading.nbgrader_run import load_config
    from lab_utils.status import Status

    course = find_course_root(course_root)
    if not (course / WORK / "gradebook.db").is_file():
        print(f"dtlabs export canvas: no gradebook at {course / WORK / 'gradebook.db'}: grade first", file=sys.stderr)
        return Status.REFUSED
    exporter = CanvasExporter(config=load_config(course), to=str(Path(out).resolve()), roster=str(roster),
                              assignment=list(labs or []), course_root=str(course))
    try:
        with Gradebook(gradebook.db_url(course)) as gb:
            exporter.export(gb)
    except RosterError as exc:
        print(f"dtlabs export canvas: {exc}", file=sys.stderr)
        return Status.REFUSED
    print(f"wrote {Path(out).resolve()}: import it in Canvas (Grades > Import)")
    return Status.DONE
