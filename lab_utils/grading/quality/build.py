"""Building submissions from the source notebook: the solution as a student would type it, or one answer swapped.

Used by the stress and mutation commands and by the tests (solution, release and known-wrong "students").
"""
from __future__ import annotations

import copy
from pathlib import Path

from lab_utils.grading.course import SOLUTION_MARKERS, WORK, cell_meta


def strip_solution_markers(source: str) -> str:
    """The solution as a student would type it: the ``### BEGIN/END SOLUTION`` lines removed."""
    return "\n".join(line for line in source.split("\n") if line.strip() not in SOLUTION_MARKERS)


def solution_cells(source_nb) -> dict:
    """grade_id -> the student-ready source of every solution cell of a solutions/ notebook."""
    return {cell_meta(c)["grade_id"]: strip_solution_markers(c["source"]) for c in source_nb.cells if cell_meta(c).get("solution")}


def fill_solutions(release_nb, source_nb, replace: dict | None = None):
    """A submission: the release with every solution cell answered (``replace`` wins over the solution)."""
    answers = {**solution_cells(source_nb), **(replace or {})}
    nb = copy.deepcopy(release_nb)
    for cell in nb.cells:
        gid = cell_meta(cell).get("grade_id")
        if cell_meta(cell).get("solution") and gid in answers:
            cell["source"] = answers[gid]
    return nb


def without_demos(nb):
    """The notebook without its demo cells (code cells with no nbgrader metadata: student-writable, never graded,
    and no test may depend on them); what a student who deleted the demos submits."""
    nb.cells = [c for c in nb.cells if c.cell_type != "code" or cell_meta(c)]
    return nb


def submit(course_root: Path | str, student: str, lab: str, nb) -> Path:
    """Place a notebook where nbgrader's autograde looks: submitted/<student>/<lab>/<lab>.ipynb."""
    import nbformat

    dest = Path(course_root) / WORK / "submitted" / student / lab / f"{lab}.ipynb"
    dest.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(dest))
    return dest


def solution_module(source_nb, grade_ids, path: Path | str, name: str, preamble: str = ""):
    """The cells ``grade_ids`` of a solutions/ notebook, markers and IPython magics removed, after ``preamble`` (the
    imports of a setup cell left out), written to ``path`` and imported as module ``name``: the solution outside a
    notebook, for code that reads its own source from a file (Triton's kernels). Lab 11's GPU tests and the CS336
    adapters (grader/cs336/) run it so."""
    import importlib.util
    import sys

    cells = {cell_meta(c).get("grade_id"): c["source"] for c in source_nb.cells}
    missing = [g for g in grade_ids if g not in cells]
    if missing:
        raise KeyError(f"the notebook has no cells {missing}")
    lines = (line for g in grade_ids for line in (strip_solution_markers(cells[g]) + "\n\n").split("\n"))
    Path(path).write_text(preamble + "\n".join(line for line in lines if not line.lstrip().startswith("%")))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
