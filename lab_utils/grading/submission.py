"""One submission graded: ``nbgrader autograde`` in a scratch course of its own.

``grade_submission`` copies the submission as data (``files.copy_submission``: no link followed) and grades the copy in a private scratch course (mode 0700, outside the course) holding a
snapshot of the course's gradebook (``prepare_template`` makes one without touching the course's), and gathers in
one ``Result`` the scores and every reason worth a grade line: nbgrader's, the sandbox's, a tampered test cell, the
first failing tests of a zero, what was left out of the copy; reasons that are the grading machine's fault (its
sandbox never started) are ``Result.environment``, never a student's zero. Each reason is an ``outcomes.Reason``.
"""
from __future__ import annotations

import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from lab_utils.grading import gradebook
from lab_utils.grading import scratch as grading_scratch
from lab_utils.grading.boundary.files import SubmissionError, copy_submission, regular_notebook
from lab_utils.grading.course import WORK, cell_meta, split_hidden
from lab_utils.grading.nbgrader_run import course_settings, run_nbgrader
from lab_utils.grading.outcomes import Kind, Reason, of_kind

# ------------------------------------------------------------------------------------------ grading one
@dataclass
class Result:
    """One submission's grading run, before it is merged."""

    lab: str
    student: str
    scratch: Path
    scores: dict = field(default_factory=dict)
    reasons: list = field(default_factory=list)  # outcomes.Reason each
    seconds: float = 0.0
    output: str = ""

    @property
    def notebook(self) -> Path:
        return self.scratch / WORK / "autograded" / self.student / self.lab / f"{self.lab}.ipynb"

    @property
    def graded(self) -> bool:
        """nbgrader wrote an autograded notebook (it records empty grades for a notebook it could not read)."""
        return bool(self.scores) and self.notebook.is_file()

    @property
    def points(self) -> tuple[float, float]:
        return sum(s for s, _ in self.scores.values()), sum(m for _, m in self.scores.values())

    @property
    def environment(self) -> list[Reason]:
        """The reasons that are the grading machine's fault (its sandbox did not start), never the student's."""
        return of_kind(self.reasons, Kind.ENVIRONMENT)


def prepare_template(course_root: Path, lab: str, dest: Path, settings=None) -> Path:
    """A scratch course whose gradebook holds ``lab``'s cells (hidden tests included), for ``grade-one``, which must
    not write the course's gradebook (``grade`` snapshots the course's own instead)."""
    shutil.copytree(course_root / "solutions" / lab, dest / "solutions" / lab)
    run = run_nbgrader(["generate_assignment", lab, "--force", f"--CourseDirectory.release_directory={WORK / 'release'}"],
                       course_root=dest, config_root=course_root, settings=settings, timeout=300)
    if run.returncode != 0:
        raise RuntimeError(f"could not record {lab} in a gradebook:\n{run.output[-3000:]}")
    return dest


_NBGRADER_REASONS = [
    (re.compile(r"DeadKernelError|Kernel died"), "dead kernel"),
    (re.compile(r"CellTimeoutError|Cell execution timed out|timed out"), "a cell ran past its time limit"),
    (re.compile(r"NotJSONError|does not appear to be JSON|JSONDecodeError"), "invalid notebook (not JSON)"),
    (re.compile(r"(ValidationError|SchemaError|[Cc]orrupted|Notebook JSON is invalid)"), "invalid notebook metadata"),
    (re.compile(r"Missing grade cell (\S+) encountered"), "test cell {0} was deleted (restored from the course)"),
]


def _reasons_from_log(text: str) -> list[str]:
    out = []
    for pattern, template in _NBGRADER_REASONS:
        for m in pattern.finditer(text):
            reason = template.format(*m.groups())
            if reason not in out:
                out.append(reason)
            if "{" not in template:
                break
    errors = [line.split("] ", 1)[-1].strip() for line in text.splitlines() if "| ERROR]" in line]
    if errors and not out:
        out.append(errors[0][:200])
    return out


def _tampered_cells(submitted_nb: Path, template: Path, lab: str) -> list[str]:
    """Locked cells (tests, course code) whose source the submission changed; nbgrader restores them."""
    import nbformat
    from nbgrader.api import Gradebook, MissingEntry

    try:
        nb = nbformat.read(str(submitted_nb), as_version=4)
    except Exception:  # noqa: BLE001 - an unreadable notebook is reported by nbgrader itself
        return []
    out = []
    with Gradebook(gradebook.db_url(template)) as gb:
        for cell in nb.cells:
            gid = cell_meta(cell).get("grade_id")
            if not gid:
                continue
            try:
                src = gb.find_source_cell(gid, lab, lab)
            except MissingEntry:
                continue
            release_source = "\n".join(split_hidden(src.source)[0])  # what the release shows of it
            if src.locked and release_source.strip() != cell.source.strip():
                out.append(f"tampered test cell {gid} (restored from the course)")
    return out


def _readable(notebook: Path) -> bool:
    """Whether nbgrader can read ``notebook`` (and so runs its code)."""
    import nbformat

    try:
        nbformat.read(str(notebook), as_version=4)
    except Exception:  # noqa: BLE001 - whatever nbformat refuses, nbgrader refuses
        return False
    return True


def _failed_cells(autograded_nb: Path) -> list[str]:
    """'test_id: Error: message' for each graded cell that failed, for a zero's reason."""
    import nbformat

    try:
        nb = nbformat.read(str(autograded_nb), as_version=4)
    except Exception:  # noqa: BLE001
        return []
    out = []
    for cell in nb.cells:
        meta = cell_meta(cell)
        if not meta.get("grade") or cell.cell_type != "code":
            continue
        for o in cell.get("outputs", []):
            if o.get("output_type") == "error":
                first = (o.get("evalue") or "").strip().split("\n")[0][:160]
                out.append(f"{meta.get('grade_id')}: {o.get('ename')}: {first}")
                break
    return out


def grade_submission(course_root: Path, lab: str, student: str, template: Path, *, settings=None,
                     scratch: Path | None = None, submission_dir: Path | None = None) -> Result:
    """Autograde one submission (``submission_dir``, by default the course's submitted/<student>/<lab>/) in a
    private scratch course, under the command's ``settings`` (default: the course's; ``submission_timeout`` is the
    wall-clock limit); its sandbox starts and ends inside this call."""
    if settings is None:
        settings = course_settings(course_root)
    timeout = settings.submission_timeout
    start = time.monotonic()
    scratch = Path(scratch or grading_scratch.make("dtlabs-grade-", tag=lab))
    scratch.mkdir(parents=True, exist_ok=True)
    os.chmod(scratch, 0o700)
    (scratch / WORK).mkdir(parents=True, exist_ok=True)
    shutil.copy2(template / WORK / "gradebook.db", scratch / WORK / "gradebook.db")
    made = gradebook.schema(scratch / WORK / "gradebook.db")  # before any submission code runs
    submitted = Path(submission_dir or course_root / WORK / "submitted" / student / lab)
    res = Result(lab, student, scratch)
    try:
        regular_notebook(submitted / f"{lab}.ipynb")
        copied = copy_submission(submitted, scratch / WORK / "submitted" / student / lab)
    except SubmissionError as exc:
        res.reasons = [Reason(Kind.STUDENT, str(exc))]
        res.seconds = time.monotonic() - start
        return res
    report = scratch / "sandbox.txt"
    from lab_utils.grading.export.late import due_date

    # before it runs: the due date late.DueDates will set, from the course's config
    expected = gradebook.expected_dates(template, lab, submitted, due_date(settings, lab))
    # a notebook nbgrader cannot read never runs: nothing of it can change the gradebook (nbgrader records it without
    # its due-date step), so it gets nbgrader's reason and no tampering verdict. Read before it runs: run without a
    # sandbox, a submission could spoil its own copy afterwards.
    ran = _readable(scratch / WORK / "submitted" / student / lab / f"{lab}.ipynb")
    run = run_nbgrader(["autograde", lab, "--student", student, "--force", f"--SplitExecute.report_path={report}"],
                       course_root=scratch, config_root=course_root, settings=settings, timeout=timeout)
    res.output = run.output
    forged = gradebook.schema_changes(scratch, made)  # before a score is read: a trigger may have written it
    if not forged:
        res.scores = gradebook.cell_scores(scratch, lab, student, auto=True)  # what merge records, nothing forged
        forged = gradebook.tampering(scratch, lab, student, expected) if ran else []
    if forged:  # a grade or late penalty it may have changed is no grade: the instructor reads why
        res.scores = {}
    reasons = [Reason(Kind.STUDENT, copied.note())] if copied.left_out else []
    if report.is_file():  # written on the subject's side: ``Reason.parse`` reads its words back
        reasons += [Reason.parse(f"sandbox: {line.strip()}") for line in report.read_text().splitlines() if line.strip()]
    said = [f"wall-clock limit: grading took over {timeout:g} s"] if run.timed_out else []
    said += _tampered_cells(scratch / WORK / "submitted" / student / lab / f"{lab}.ipynb", template, lab)
    said += _reasons_from_log(run.output) + forged
    if res.graded and res.points[0] == 0:
        said += _failed_cells(res.notebook)[:3]
    reasons += [Reason(Kind.STUDENT, text) for text in said]
    res.reasons = list(dict.fromkeys(reasons))
    res.seconds = time.monotonic() - start
    return res
