"""``dtlabs grade``: every submission graded in its own sandbox and scratch course, N at a time, then merged.

Per lab: the course's gradebook records the assignment (``generate_assignment`` into a scratch release folder,
so ``labs/`` is untouched) and is snapshotted once. Per submission: a private scratch course (mode 0700,
outside the course) gets a copy of that snapshot and of the submission alone,
and ``nbgrader autograde --student S`` runs there; its kernel starts the submission's code in the sandbox
(``lab_utils.grading.sandbox``). When that run is over (sandbox gone), ``gradebook.merge`` copies the result into the
course; only this process writes the course's gradebook. Then CSV export and feedback, as nbgrader does them.

A re-run grades only new or changed submissions (``grader/work/graded.json`` keeps a digest of each
submission's files and of the lab's source notebook); ``--force`` regrades all. Every line that is NOT GRADED
or scores zero carries the reason in one line (nbgrader's or the sandbox's).
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

from lab_utils.grading import gradebook
from lab_utils.grading.course import REPO_ROOT, WORK, discover_labs, split_hidden, submissions
from lab_utils.grading.guard import Guard, GuardError
from lab_utils.grading.nbgrader_run import run_nbgrader

DEFAULT_SUBMISSION_TIMEOUT_S = 1800.0


@dataclass
class Result:
    """One submission's grading run, before it is merged."""

    lab: str
    student: str
    scratch: Path
    scores: dict = field(default_factory=dict)
    reasons: list = field(default_factory=list)
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


def prepare_template(course_root: Path, lab: str, dest: Path) -> Path:
    """A scratch course whose gradebook holds ``lab``'s cells (hidden tests included), for ``grade-one``, which must
    not write the course's gradebook (``grade`` snapshots the course's own instead)."""
    shutil.copytree(course_root / "solutions" / lab, dest / "solutions" / lab)
    run = run_nbgrader(["generate_assignment", lab, "--force", f"--CourseDirectory.release_directory={WORK / 'release'}"],
                       course_root=dest, timeout=300)
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
            gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
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


def _failed_cells(autograded_nb: Path) -> list[str]:
    """'test_id: Error: message' for each graded cell that failed, for a zero's reason."""
    import nbformat

    try:
        nb = nbformat.read(str(autograded_nb), as_version=4)
    except Exception:  # noqa: BLE001
        return []
    out = []
    for cell in nb.cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if not meta.get("grade") or cell.cell_type != "code":
            continue
        for o in cell.get("outputs", []):
            if o.get("output_type") == "error":
                first = (o.get("evalue") or "").strip().split("\n")[0][:160]
                out.append(f"{meta.get('grade_id')}: {o.get('ename')}: {first}")
                break
    return out


def grade_submission(course_root: Path, lab: str, student: str, template: Path, *, cell_timeout=None,
                     timeout: float | None = DEFAULT_SUBMISSION_TIMEOUT_S, scratch: Path | None = None) -> Result:
    """Autograde one submission in a private scratch course (its sandbox starts and ends inside this call)."""
    start = time.monotonic()
    scratch = Path(scratch or tempfile.mkdtemp(prefix=f"dtlabs-grade-{lab}-"))
    scratch.mkdir(parents=True, exist_ok=True)
    os.chmod(scratch, 0o700)
    (scratch / WORK).mkdir(parents=True, exist_ok=True)
    shutil.copy2(template / WORK / "gradebook.db", scratch / WORK / "gradebook.db")
    shutil.copytree(course_root / WORK / "submitted" / student / lab, scratch / WORK / "submitted" / student / lab)
    report = scratch / "sandbox.txt"
    run = run_nbgrader(["autograde", lab, "--student", student, "--force", f"--SplitExecute.report_path={report}"],
                       course_root=scratch, cell_timeout=cell_timeout, timeout=timeout)
    res = Result(lab, student, scratch, output=run.output)
    res.scores = gradebook.cell_scores(scratch, lab, student)
    reasons = []
    if report.is_file():
        reasons += [f"sandbox: {line.strip()}" for line in report.read_text().splitlines() if line.strip()]
    if run.timed_out:
        reasons.append(f"wall-clock limit: grading took over {timeout:g} s")
    reasons += _tampered_cells(scratch / WORK / "submitted" / student / lab / f"{lab}.ipynb", template, lab)
    reasons += _reasons_from_log(run.output)
    if res.graded and res.points[0] == 0:
        reasons += _failed_cells(res.notebook)[:3]
    res.reasons = list(dict.fromkeys(reasons))
    res.seconds = time.monotonic() - start
    return res


# ------------------------------------------------------------------------------------------ what changed
def _digest(paths) -> str:
    h = hashlib.sha256()
    for p in sorted(paths):
        if p.is_file():
            h.update(str(p.name).encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def submission_digest(course_root: Path, lab: str, student: str) -> str:
    sub = course_root / WORK / "submitted" / student / lab
    src = course_root / "solutions" / lab / f"{lab}.ipynb"
    return _digest([*sub.rglob("*"), src])


MANIFEST = "graded.json"  # "lab/student" -> digest of the submission (and source) last graded


def _put_back_reason(touched: list[str], course_root: Path) -> str:
    """The grade line's note for course files a submission changed (``Guard.restore``), or ''."""
    if not touched:
        return ""
    shown = ", ".join(os.path.relpath(t, course_root) if Path(t).is_relative_to(course_root) else t
                      for t in touched[:4])
    more = f" and {len(touched) - 4} more" if len(touched) > 4 else ""
    return f"sandbox: it changed files of the course while graded (put back): {shown}{more}"


# ------------------------------------------------------------------------------------------ the batch
def grade(labs=None, *, course_root=None, submissions_dir=None, cell_timeout=None, lab_timeout=None,
          submission_timeout=None, force=False, feedback=True, csv_path=None, jobs=1, out=print,
          progress=True) -> int:
    """Instructor batch: autograde (sandboxed, ``jobs`` at once) -> merge -> CSV -> feedback (no hidden tests).

    Returns 0 when every submission was graded, 1 when some could not be (listed with the reason; the rest are
    graded and exported regardless), 2 on a setup problem (nothing submitted, a lab with no source).
    """
    from lab_utils.grading import sandbox

    course_root = Path(course_root or REPO_ROOT).resolve()
    submitted = course_root / WORK / "submitted"
    if submissions_dir:
        src = Path(submissions_dir).resolve()
        if not src.is_dir():
            out(f"no such folder: {src}")
            return 2
        if src != submitted.resolve():
            shutil.copytree(src, submitted, dirs_exist_ok=True)
    found = submissions(course_root)
    labs = list(labs) if labs else sorted(found)
    if not labs:
        out(f"nothing to grade: no submissions under {submitted} (layout: <student>/<NN_topic>/<NN_topic>.ipynb)")
        return 2
    known = discover_labs(course_root)
    unknown = [lab for lab in labs if lab not in known]
    if unknown:
        out(f"SKIPPED {unknown}: no solutions/<lab>/<lab>.ipynb source for them (known labs: {known})")
    labs = [lab for lab in labs if lab in known]
    if not labs:
        return 2
    fallback = sandbox.mode() != "bwrap"
    if fallback:
        out("WARNING: " + sandbox.FALLBACK_WARNING)
        if int(jobs) > 1:
            out(f"--jobs {jobs} needs bubblewrap: without it the course is checked between submissions, so they "
                "are graded one at a time")
        jobs = 1
    out(f"sandbox: {sandbox.mode()}, {jobs} at a time")
    manifest = {} if force else gradebook.read_record(course_root, MANIFEST)
    problems, scratch_dirs = [], []
    todo = []
    for lab in labs:
        students = found.get(lab, [])
        if force or not gradebook.holds_current(course_root, lab):
            run = run_nbgrader(["generate_assignment", lab, "--force",
                                f"--CourseDirectory.release_directory={WORK / 'release'}"],
                               course_root=course_root, timeout=300)
            if run.returncode != 0:
                out(run.output[-3000:])
                out(f"could not record {lab} in the gradebook (see above)")
                return 2
            gradebook.note_recorded(course_root, [lab])
        gradebook.register_students(course_root, students)
        fresh = []
        for student in students:
            digest = submission_digest(course_root, lab, student)
            graded_before = manifest.get(f"{lab}/{student}") == digest and gradebook.cell_scores(course_root, lab, student)
            if graded_before:
                continue
            fresh.append((student, digest))
        skipped = len(students) - len(fresh)
        out(f"== {lab}: {len(students)} submission(s), {len(fresh)} to grade" + (
            f" ({skipped} unchanged since last graded; --force regrades them)" if skipped else ""))
        if fresh:  # the course's gradebook now holds the lab: a snapshot of it is every submission's template
            tdir = Path(tempfile.mkdtemp(prefix=f"dtlabs-template-{lab}-"))
            scratch_dirs.append(tdir)
            (tdir / WORK).mkdir(parents=True)
            shutil.copy2(course_root / WORK / "gradebook.db", tdir / WORK / "gradebook.db")
            todo += [(lab, student, digest, tdir) for student, digest in fresh]

    per_submission = submission_timeout or lab_timeout or DEFAULT_SUBMISSION_TIMEOUT_S
    guard, stopped = None, None
    if fallback and todo:  # bubblewrap hides all of this from a submission; without it, put back what one changed
        work = course_root / WORK
        guard = Guard([work / "gradebook.db", work / MANIFEST, work / gradebook.SOURCES, work / "submitted",
                       *{tdir for *_, tdir in todo}, course_root / "solutions", course_root / "grader", sandbox.PKG_DIR],
                      skip=[work])
        guard.snapshot()
    bar = None
    if progress and todo:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(todo), desc="grading", unit="submission", dynamic_ncols=True)
    with ThreadPoolExecutor(max_workers=max(1, int(jobs))) as pool:
        futures = {pool.submit(grade_submission, course_root, lab, student, tdir, cell_timeout=cell_timeout,
                               timeout=per_submission): (lab, student, digest) for lab, student, digest, tdir in todo}
        for fut in as_completed(futures):
            lab, student, digest = futures[fut]
            try:
                res, failure = fut.result(), None
            except Exception as exc:  # noqa: BLE001 - one broken submission never stops the batch
                res, failure = None, f"grading failed: {type(exc).__name__}: {exc}"
            try:
                touched = guard.restore() if guard is not None else []
            except GuardError as exc:
                stopped = f"STOPPED after {student}/{lab}: {exc}; grade again once the course is whole"
                for f in futures:
                    f.cancel()
                break
            put_back = _put_back_reason(touched, course_root)
            merged = False
            if res is None:
                problems.append((lab, student))
                out(f"   NOT GRADED: {student}/{lab} ({'; '.join(filter(None, [failure, put_back]))})")
            else:
                scratch_dirs.append(res.scratch)
                if put_back:
                    res.reasons.append(put_back)
                merged = res.graded and gradebook.merge(course_root, res.scratch, lab, student)
                why = "; ".join(res.reasons)
                if merged:
                    manifest[f"{lab}/{student}"] = digest
                    gradebook.write_record(course_root, MANIFEST, manifest)
                    got, possible = res.points
                    line = f"   {student}/{lab}: {got:g}/{possible:g} ({res.seconds:.0f} s)"
                    if got == 0 or res.reasons:
                        line += f" - {why or 'no test passed'}"
                    out(line)
                else:
                    problems.append((lab, student))
                    manifest.pop(f"{lab}/{student}", None)
                    out(f"   NOT GRADED: {student}/{lab} ({why or 'nbgrader produced no grade; see its log'})")
            if guard is not None:
                guard.snapshot()  # this process's own writes (the merge, the manifest) are the new baseline
            if bar is not None:
                bar.set_postfix_str(f"{student}/{lab} {'ok' if merged else 'NOT GRADED'}")
                bar.update(1)
    if bar is not None:
        bar.close()
    for d in scratch_dirs:
        shutil.rmtree(d, ignore_errors=True)
    if stopped:
        out(stopped)
        return 2

    csv_path = Path(csv_path) if csv_path else course_root / WORK / "grades.csv"
    run = run_nbgrader(["export", f"--to={csv_path.resolve()}"], course_root=course_root, timeout=300)
    out(f"grades: {csv_path}" if run.returncode == 0 else f"export failed:\n{run.output[-3000:]}")
    if feedback:
        for lab in labs:
            run = run_nbgrader(["generate_feedback", lab, "--force"], course_root=course_root, timeout=600)
            if run.returncode != 0:
                out(f"   feedback for {lab} incomplete:\n{run.output[-2000:]}")
        out(f"feedback: {course_root / WORK / 'feedback'}")
    if problems:
        out(f"{len(problems)} submission(s) could not be graded: " + ", ".join(f"{s}/{a}" for a, s in problems))
        return 1
    return 2 if unknown else 0


def autograde(lab: str, *, course_root=None, cell_timeout=None, timeout=None, force=True, echo=False):
    """One ``nbgrader autograde LAB`` over every submission of a course (tests: many "students" in one run).

    Each submission still runs in its own sandbox (one subject per kernel); only the gradebook is shared, so use
    ``grade`` for real classes."""
    args = ["autograde", lab] + (["--force"] if force else [])
    return run_nbgrader(args, course_root=course_root, cell_timeout=cell_timeout, timeout=timeout, echo=echo)
