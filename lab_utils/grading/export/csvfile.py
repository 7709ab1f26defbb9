"""Every CSV the course writes (``grades.csv``, the Canvas import): each field quoted, no cell a spreadsheet formula.

nbgrader's ``CsvExportPlugin`` joins fields with commas unquoted, so a student id holding a comma and a newline adds
a row of its own making, and a cell that begins with ``=`` is a live formula (``=HYPERLINK(...)``) in the
spreadsheet the instructor opens. ``write`` follows OWASP's rule for CSV injection: every field quoted
(``csv.QUOTE_ALL``), and a field that begins with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return gets a
single quote in front, which a spreadsheet shows as text. ``GradesCsvExporter`` is nbgrader's CSV export (the same
columns and rows) written so; ``apply_nbgrader_config`` makes it the course's ``nbgrader export``, which
``dtlabs grade`` runs for ``grades.csv``.
"""
from __future__ import annotations

import csv
from pathlib import Path

from nbgrader.plugins import ExportPlugin

FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
COLUMNS = ["assignment", "duedate", "timestamp", "student_id", "last_name", "first_name", "email", "raw_score",
           "late_submission_penalty", "score", "max_score"]  # nbgrader's CsvExportPlugin's, in its order


def cell(value) -> str:
    """``value`` as a CSV field a spreadsheet shows as text: '' for None, a quote before a formula's first sign."""
    text = "" if value is None else str(value)
    return "'" + text if text.startswith(FORMULA_START) else text


def write(path: Path | str, rows) -> None:
    """Write ``rows`` (lists of values) to ``path``: every field quoted and formula-safe (``cell``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as fh:
        csv.writer(fh, quoting=csv.QUOTE_ALL).writerows([cell(v) for v in row] for row in rows)


class GradesCsvExporter(ExportPlugin):
    """nbgrader ExportPlugin: nbgrader's grades CSV (``CsvExportPlugin``'s columns and rows), quoted and
    formula-safe. A student without a submission scores 0, as in nbgrader's."""

    def export(self, gradebook) -> None:
        from nbgrader.api import MissingEntry

        dest = self.to or "grades.csv"
        students = {str(s) for s in self.student}
        labs = {str(a) for a in self.assignment}
        self.log.info("Exporting grades to %s", dest)
        rows = [COLUMNS]
        for assignment in gradebook.assignments:
            if labs and assignment.name not in labs:
                continue
            for student in gradebook.students:
                if students and student.id not in students:
                    continue
                try:
                    sub = gradebook.find_submission(assignment.name, student.id)
                except MissingEntry:
                    timestamp, raw, penalty, score = "", 0.0, 0.0, 0.0
                else:
                    timestamp, raw, penalty = sub.timestamp, sub.score, sub.late_submission_penalty
                    score = max(0.0, sub.score - penalty)
                rows.append([assignment.name, assignment.duedate, timestamp, student.id, student.last_name,
                             student.first_name, student.email, raw, penalty, score, assignment.max_score])
        write(dest, rows)
