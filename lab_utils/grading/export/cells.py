"""A lab's test cells, and what an autograded notebook says about each: the facts every exit reports.

Gradescope's per-test results, the Canvas export's points and the class report all speak of the same cells: the
graded cells of the lab's source notebook (``solutions/``), with their points, whether they hold hidden tests, and
the exercise they check. What a failing cell said is read from the autograded notebook (the grader kernel's
output; student code never ran there) as its error's ``Name: message``, never its traceback, which quotes the test's
source; and every such text is redacted against the lab's hidden lines (``feedback.redact``), because a message can
quote its own hidden assertion or print what a student's answer learnt of the tests.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from lab_utils.grading.course import HIDDEN_MARKERS
from lab_utils.grading.feedback import hidden_lines, redact

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
NO_MESSAGE = "failed without an error message (the cell may have been stopped at its time limit)"


@dataclass(frozen=True)
class GradedCell:
    """One graded cell of a lab."""

    grade_id: str
    points: float
    hidden: bool  # it holds hidden tests: its result tells how they went
    title: str = ""  # the heading above it, since the previous test cell ("" if none)

    @property
    def name(self) -> str:
        """How results name it: the exercise's heading and the cell's id, or the id alone."""
        return f"{self.title} ({self.grade_id})" if self.title else self.grade_id


def _meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def read(path):
    import nbformat

    return nbformat.read(str(path), as_version=4)


def source_notebook(course_root: Path | str, lab: str):
    return read(Path(course_root) / "solutions" / lab / f"{lab}.ipynb")


def graded_cells(source_nb) -> list[GradedCell]:
    """The graded code cells of a source notebook, in notebook order."""
    out, title = [], ""
    for cell in source_nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.split("\n"):
                if line.startswith("#"):
                    title = line.lstrip("#").strip()
            continue
        meta = _meta(cell)
        if cell.cell_type == "code" and meta.get("grade") and meta.get("grade_id"):
            out.append(GradedCell(meta["grade_id"], float(meta.get("points") or 0), HIDDEN_MARKERS[0] in cell.source,
                                title))
            title = ""
    return out


def lab_hidden_lines(source_nb) -> list[str]:
    """Every hidden line of the lab worth redacting (``feedback.hidden_lines`` of each test cell)."""
    return [h for c in source_nb.cells if c.cell_type == "code" for h in hidden_lines(c.source)]


def clean(text: str, hidden: list[str], limit: int = 4000) -> str:
    """``text`` safe to show: no terminal colours, no line that quotes a hidden line, at most ``limit`` characters."""
    text = redact(ANSI.sub("", text or ""), hidden).strip()
    return text if len(text) <= limit else text[: limit - 20].rstrip() + "\n... (cut)"


def messages(autograded_nb, hidden: list[str]) -> dict:
    """grade_id -> 'Name: message' of every graded cell whose run ended in an error, redacted (see module doc)."""
    out = {}
    for cell in autograded_nb.cells:
        meta = _meta(cell)
        if cell.cell_type != "code" or not meta.get("grade"):
            continue
        for o in cell.get("outputs", []):
            if o.get("output_type") == "error":
                evalue = (o.get("evalue") or "").strip()
                out[meta.get("grade_id")] = clean(f"{o.get('ename') or 'Error'}: {evalue}" if evalue
                                                  else (o.get("ename") or "Error"), hidden)
                break
    return out


def first_line(message: str, limit: int = 200) -> str:
    line = (message or "").strip().split("\n")[0]
    return line if len(line) <= limit else line[: limit - 3] + "..."
