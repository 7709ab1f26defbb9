"""Many answers, one grading session: how each swapped answer scores, without a kernel and sandbox per answer.

Proving a lab's tests (the release scores zero, each known-wrong answer loses the cells it names, a mutant loses
something) as one ``nbgrader autograde`` submission per answer costs a kernel and a sandboxed subject per answer,
each importing torch, and a rank server's warm-up, for a few seconds of tests. Here one session grades them all, through the same split execution as ``autograde`` (``SplitExecute``: answers in the sandboxed
subject, tests in the grader kernel, scores by nbgrader's own ``determine_grade``):

1. the lab's source notebook runs once with the solution typed in and the demo cells left out: the *baseline*;
2. each swap replaces one or more answer cells, re-runs every cell from the first replaced one on (up to the last
   graded cell that matters to it), and scores the graded cells it ran. Swaps run latest first replaced cell
   first: every cell before a swap's first one then still holds what the solution defined (earlier swaps only
   re-ran cells from their own, later, first cell on), and the swap re-runs everything from there, so nothing
   has to be put back between swaps;
3. after the last swap the solution's cells are run again once, over every cell a swap ran (restoring the
   session);
4. then every graded cell runs once more: the *control*, which must equal the baseline, or a swap left the
   session changed (outside the cells it re-ran: a file, a process, a patched module) and the verdicts after it
   cannot be trusted.

It is a test of the tests, not a grade: a student's submission is always graded alone (``dtlabs grade``). The same
answers graded one submission each (``DTLABS_FULL=1`` in tests/labs/test_labs.py) give the same verdicts,
and tests/grading/test_grading_cli.py checks that on the synthetic lab.
"""
from __future__ import annotations

import copy
import json
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from lab_utils.grading.quality.build import solution_cells, without_demos
from lab_utils.grading.course import cell_meta, find_course_root
from lab_utils.grading.split.execute import GRADER, SHARED, STUDENT, STUDENT_MAGIC, SplitExecute

@dataclass
class Swap:
    """Answer cells replaced (grade_id -> source); ``until``: the last graded cell that matters (None: all);
    ``first_loss``: stop at the first graded cell that loses points (a mutant is killed by any loss)."""

    name: str
    answers: dict
    until: str | None = None
    first_loss: bool = False


@dataclass
class SwapResult:
    scores: dict                                  # grade_id -> (earned, possible) of the graded cells it ran
    errors: dict = field(default_factory=dict)    # grade_id -> the first error line of each cell that lost points
    timed_out: list = field(default_factory=list)  # grade_ids of cells that ran past the cell limit
    seconds: float = 0.0
    cell_seconds: dict = field(default_factory=dict)  # grade_id (or cell id) -> seconds, every cell it ran
    last: int = -1                                    # the index of the last cell it ran


@dataclass
class SwapReport:
    lab: str
    baseline: SwapResult
    results: dict                                 # swap name -> SwapResult
    control: SwapResult
    restore_errors: list                          # "restore: cell: error" where putting the solution back failed
    mode: str                                     # the sandbox mode of the session's subject
    seconds: float


def _graded(cell) -> bool:
    return bool(cell_meta(cell).get("grade") and cell_meta(cell).get("points") is not None and not cell_meta(cell).get("solution"))


def session_notebook(source_nb):
    """The source with the solution typed in (markers stripped) and the demo cells (no nbgrader metadata) left out:
    what a student who deleted the demos submits, with the hidden tests in place as autograde puts them back."""
    answers = solution_cells(source_nb)
    nb = without_demos(copy.deepcopy(source_nb))
    for cell in nb.cells:
        if cell_meta(cell).get("solution"):
            cell.source = answers[cell_meta(cell)["grade_id"]]
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    return nb


def release_swap(lab: str, root: Path | str | None = None) -> Swap:
    """The untouched release: every answer cell as ``labs/`` ships it (its stub)."""
    rel = nbformat.read(str(find_course_root(root) / "labs" / lab / f"{lab}.ipynb"), as_version=4)
    return Swap("release", {cell_meta(c)["grade_id"]: c.source for c in rel.cells if cell_meta(c).get("solution")})


class SwapSession(SplitExecute):
    """``SplitExecute`` that keeps its kernel and subject across many swapped answers (module docstring)."""

    def check(self, nb, workdir: str, swaps) -> SwapReport:
        start = time.monotonic()
        resources = {"metadata": {"path": workdir}}
        with self.split(nb, resources) as route:
            NotebookClient.__init__(self, nb, None)
            self.reset_execution_trackers()
            self._check_assign_resources(resources)
            with self.setup_kernel():
                self.wait_for_reply(self.kc.kernel_info())
                self.routes = route
                self.execute_cell(nb.cells[0], 0, store_history=False)  # starts the subject
                mode = _mode(nb.cells[0])
                self.defines = {}  # grader cell index -> the names it defined in the baseline
                baseline = self._run(range(1, len(nb.cells)), {}, note_names=True)
                results, first, last = {}, len(nb.cells), -1  # the cells the swaps ran: first..last
                spans = sorted(((self._span(s), s) for s in swaps), key=lambda p: -p[0].start)  # latest first
                for span, swap in spans:
                    self._forget([n for i in span for n in self.defines.get(i, ())])
                    results[swap.name] = res = self._run(span, swap.answers, first_loss=swap.first_loss)
                    first, last = span.start, max(last, res.last)
                restore_errors = [f"restore: {e}" for e in self._restore(range(first, last + 1))]
                control = self._run([i for i, c in enumerate(nb.cells) if c.cell_type == "code" and _graded(c)], {})
        results = {s.name: results[s.name] for s in swaps}
        return SwapReport("", baseline, results, control, restore_errors, mode, time.monotonic() - start)

    # -------------------------------------------------------------------------------------------- internals
    def _span(self, swap: Swap) -> range:
        cells = self.nb.cells
        first = [i for i, c in enumerate(cells) if cell_meta(c).get("solution") and cell_meta(c)["grade_id"] in swap.answers]
        if not first:
            raise ValueError(f"swap {swap.name!r} names no answer cell of this lab: {sorted(swap.answers)}")
        last = len(cells) - 1
        if swap.until:
            ends = [i for i, c in enumerate(cells) if cell_meta(c).get("grade_id") == swap.until]
            if not ends:
                raise ValueError(f"swap {swap.name!r}: no graded cell {swap.until!r}")
            last = ends[-1]
        return range(min(first), last + 1)

    def _run(self, indices, answers: dict, note_names: bool = False, first_loss: bool = False) -> SwapResult:
        """Run cells ``indices`` (answers swapped in); the scores of the graded ones among them."""
        start = time.monotonic()
        out = SwapResult({})
        for i in indices:
            cell = self.nb.cells[i]
            if cell.cell_type != "code":
                continue
            run = copy.deepcopy(cell)
            gid = cell_meta(cell).get("grade_id")
            if self.routes[i] == STUDENT and gid in answers:
                run.source = STUDENT_MAGIC + answers[gid]
            t = time.monotonic()
            if note_names and self.routes[i] == GRADER:
                self._grader_code("_dtlabs_before = set(globals())")
            self._execute_copy(run, i)
            if note_names and self.routes[i] == GRADER:
                self.defines[i] = json.loads(self._grader_code(
                    "import json as _j; print(_j.dumps(sorted(set(globals()) - _dtlabs_before)))") or "[]")
            out.cell_seconds[gid or cell.get("id")] = round(time.monotonic() - t, 2)
            if _graded(cell):
                from nbgrader.utils import determine_grade

                out.scores[gid] = determine_grade(run)
                if any(o.get("ename") == "CellTimeoutError" for o in run.outputs):
                    out.timed_out.append(gid)
                if out.scores[gid][0] != out.scores[gid][1]:
                    out.errors[gid] = _first_error(run)
                    if first_loss:
                        out.last = i
                        break
            out.last = i
        out.seconds = time.monotonic() - start
        return out

    def _grader_code(self, code: str) -> str:
        """Run bookkeeping code in the grader kernel (never in the subject); what it printed."""
        cell = nbformat.v4.new_code_cell(code)
        self.execute_cell(cell, 0, store_history=False)
        return "".join(o.get("text", "") for o in cell.outputs if o.get("output_type") == "stream").strip()

    def _forget(self, names) -> None:
        """A test cell about to run again starts as in a fresh run: what it defined last time is gone (a later
        test that checks an earlier one finished, ``assert "result" in globals()``, fails fast as it would)."""
        if names:
            self._grader_code(f"for _n in {sorted(set(names))!r}:\n    globals().pop(_n, None)")

    def _execute_copy(self, run, i) -> None:
        """Execute ``run`` as cell ``i`` (nbclient puts the cell it ran into the notebook: the original goes back)."""
        original = self.nb.cells[i]
        run.outputs = []
        try:
            self.execute_cell(run, i, store_history=False)
        finally:
            self.nb.cells[i] = original

    def _restore(self, span) -> list[str]:
        """Put the solution back: the answer and course cells of the span, run again as they are."""
        errors = []
        for i in span:
            cell = self.nb.cells[i]
            if cell.cell_type != "code" or self.routes[i] not in (STUDENT, SHARED):
                continue
            run = copy.deepcopy(cell)
            self._execute_copy(run, i)
            errors += [f"{cell_meta(cell).get('grade_id', cell.get('id'))}: {o.get('ename')}: {o.get('evalue')}"
                       for o in run.outputs if o.get("output_type") == "error"]
        return errors


def _first_error(cell) -> str:
    for o in cell.outputs:
        if o.get("output_type") == "error":
            return f"{o.get('ename')}: {o.get('evalue')}"[:500]
        if o.get("output_type") == "stream" and o.get("name") == "stderr":
            return "stderr: " + o.get("text", "")[:500]
    return "partial credit"


def _mode(preamble) -> str:
    """The sandbox mode ``start_grading`` returned in the first cell, or why the subject did not start."""
    for o in preamble.get("outputs", []):
        if o.get("output_type") == "execute_result":
            return o["data"].get("text/plain", "").strip("'\"")
        if o.get("output_type") == "error":
            return f"no subject: {o.get('ename')}: {o.get('evalue')}"
    return "unknown"


def check_swaps(lab: str, swaps, *, root: Path | str | None = None, cell_timeout: int | None = None) -> SwapReport:
    """Grade ``swaps`` of ``lab`` in one session (module docstring), each cell under ``cell_timeout`` seconds (default:
    the course's ``c.DTLabs.cell_timeout``, the limit grading gives a student's cell); nothing it starts outlives
    it."""
    from lab_utils.grading.nbgrader_run import course_settings

    root = find_course_root(root)
    if cell_timeout is None:
        cell_timeout = course_settings(root).cell_timeout
    nb = session_notebook(nbformat.read(str(root / "solutions" / lab / f"{lab}.ipynb"), as_version=4))
    work = Path(tempfile.mkdtemp(prefix=f"dtlabs-swaps-{lab}-"))
    try:
        release = root / "labs" / lab
        for item in release.iterdir() if release.is_dir() else ():  # the data files a submission holds, no notebook
            if item.suffix != ".ipynb" and not item.name.startswith("."):
                (shutil.copytree if item.is_dir() else shutil.copy2)(item, work / item.name)
        session = SwapSession(timeout=cell_timeout, interrupt_on_timeout=True, raise_on_iopub_timeout=False,
                              allow_errors=True, kernel_name="python3")
        report = session.check(nb, str(work), swaps)
        report.lab = lab
        return report
    finally:
        shutil.rmtree(work, ignore_errors=True)
