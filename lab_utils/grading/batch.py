"""``dtlabs grade``: a class graded, each submission in its own sandbox and scratch course, N at a time, then merged.

Per lab: first the canary (``canary``: the lab's solution and its empty release, graded here as a submission would
be) must pass, or nothing is graded and nothing is written to the gradebook. Then the course's gradebook records
the assignment (``generate_assignment`` into a scratch release folder, so ``labs/`` is untouched), a snapshot of it
is every submission's template, and ``submission.grade_submission`` grades each one; when its sandbox is gone,
``gradebook.merge`` copies the result into the course: only this process writes the course's gradebook. A submission
whose sandbox fails for a reason that is not the student's is not graded, and nobody else is until the canary
passes again. Then CSV export and feedback, as nbgrader does them.

A re-run grades only new or changed submissions (``grader/work/graded.json`` keeps a digest of each
submission's files and of the lab's source notebook); ``--force`` regrades all. Every line that is NOT GRADED
or scores zero carries the reason in one line (nbgrader's or the sandbox's).

Every student folder passes the door first (``boundary.ids.scan``): an id that breaks the rule, a pair that differs
only in case, a symlinked or unreadable folder is NOT GRADED with the reason, printed escaped, never copied or
registered. A class folder from ``--submissions`` is the students' own upload, so its ``timestamp.txt`` files are
dropped; the submission times are the instructor's (``--timestamps``, ``inbox.read_timestamps``). A student of the
gradebook with no submission of a lab is listed MISSING.
"""
from __future__ import annotations

import os
import shutil
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from lab_utils import processes
from lab_utils.grading import canary, gradebook, outcomes
from lab_utils.grading import scratch as grading_scratch
from lab_utils.grading.boundary import ids, inbox, sandbox
from lab_utils.grading.course import WORK, discover_labs, find_course_root
from lab_utils.grading.boundary.guard import Guard, GuardError, startup_watch
from lab_utils.grading.nbgrader_run import course_settings, run_nbgrader
from lab_utils.grading.outcomes import Kind, Reason
from lab_utils.grading.submission import Result, grade_submission
from lab_utils.status import Status

MANIFEST = "graded.json"  # "lab/student" -> digest of the submission (and source) last graded


def _put_back_reason(touched: list[str], course_root: Path) -> Reason | None:
    """The grade line's note for course files a submission changed (``Guard.restore``), or None."""
    if not touched:
        return None
    shown = ", ".join(os.path.relpath(t, course_root) if Path(t).is_relative_to(course_root) else t
                      for t in touched[:4])
    more = f" and {len(touched) - 4} more" if len(touched) > 4 else ""
    return Reason(Kind.STUDENT, f"it changed files of the course while graded (put back): {shown}{more}", "sandbox")


# ------------------------------------------------------------------------------------------ the batch
class _Batch:
    """One ``grade`` run's state: the manifest, the guard, the progress bar, and what each result becomes."""

    def __init__(self, course_root: Path, manifest: dict, guard, out, bar):
        self.course_root, self.manifest, self.guard, self.out, self.bar = course_root, manifest, guard, out, bar
        self.problems: list = []
        self.scratch_dirs: list = []

    def _guard(self) -> Reason | None:
        """Put back what the last submission changed in the course (unprotected); the grade line's note."""
        touched = self.guard.restore() if self.guard is not None else []  # GuardError stops the batch
        if self.guard is not None:  # this process's own writes (the merge, the manifest) are the new baseline
            self.guard.snapshot(watch=False)  # the startup watch's still holds: restore's check just passed
        return _put_back_reason(touched, self.course_root)

    def record(self, lab, student, digest, res: Result | None, failure: Reason | None) -> None:
        """Merge a graded result, or say why it was not; put back what it changed (unprotected)."""
        put_back = self._guard()
        merged = False
        if res is None:
            self.problems.append((lab, student))
            outcomes.note(self.course_root, lab, student, graded=False, reasons=[failure, put_back])
            self.out(f"   NOT GRADED: {student}/{lab} ({'; '.join(map(str, filter(None, [failure, put_back])))})")
        else:
            self.scratch_dirs.append(res.scratch)
            if put_back:
                res.reasons.append(put_back)
            merged = res.graded and not res.environment and gradebook.merge(self.course_root, res.scratch, lab, student)
            why = "; ".join(map(str, res.reasons))
            outcomes.note(self.course_root, lab, student, graded=merged, points=res.points if merged else None,
                          reasons=res.reasons or ([] if merged else [Reason(Kind.COURSE, "nbgrader produced no grade")]),
                          seconds=res.seconds)
            if merged:
                self.manifest[f"{lab}/{student}"] = digest
                gradebook.write_record(self.course_root, MANIFEST, self.manifest)
                got, possible = res.points
                line = f"   {student}/{lab}: {got:g}/{possible:g} ({res.seconds:.0f} s)"
                if got == 0 or res.reasons:
                    line += f" - {why or 'no test passed'}"
                self.out(line)
            else:
                self.problems.append((lab, student))
                self.manifest.pop(f"{lab}/{student}", None)
                self.out(f"   NOT GRADED: {student}/{lab} ({why or 'nbgrader produced no grade; see its log'})")
        if self.guard is not None:
            self.guard.snapshot(watch=False)
        if self.bar is not None:
            self.bar.set_postfix_str(f"{student}/{lab} {'ok' if merged else 'NOT GRADED'}")
            self.bar.update(1)

    def run(self, todo, jobs, **grading) -> list:
        """Grade ``todo`` ((lab, student, digest, template) each), ``jobs`` at a time. Stops taking new ones at the
        first environment fault and returns the ones it did not grade (the fault's first), else []."""
        left: list = []
        # With a guard, the next submission starts only once the last one's changes are put back (``record``): a
        # pool would start it while this thread still restores, and it would run with what the last one left.
        jobs = 1 if self.guard is not None else max(1, int(jobs))
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            pending = list(todo)
            futures = {}

            def submit_next():
                if pending:
                    item = pending.pop(0)
                    lab, student, _digest, tdir = item
                    futures[pool.submit(grade_submission, self.course_root, lab, student, tdir, **grading)] = item

            for _ in range(jobs):
                submit_next()
            while futures:
                fut = next(as_completed(futures))
                lab, student, digest, _tdir = item = futures.pop(fut)
                try:
                    res, failure = fut.result(), None
                except Exception as exc:  # noqa: BLE001 - one broken submission never stops the batch
                    res, failure = None, Reason(Kind.COURSE, f"grading failed: {type(exc).__name__}: {exc}")
                if res is not None and res.environment and not left:
                    # not the student's fault: nothing more starts until the canary passes again; the ones still
                    # running finish and are recorded
                    left.append(item)
                    self.scratch_dirs.append(res.scratch)
                    self._guard()
                    self.out(f"   NOT YET GRADED: {student}/{lab} ({'; '.join(map(str, res.environment))})")
                    left += pending
                    pending.clear()
                    continue
                self.record(lab, student, digest, res, failure)
                submit_next()
        return left


CPUS_PER_SUBMISSION = 2  # a lab's demos and tests run 2 ranks; the grader kernel and subject mostly wait on them


def default_jobs(settings) -> tuple[int, str]:
    """How many submissions to grade at once when ``--jobs`` is not given, and why: the CPU budget
    (``lab_utils.cgroups``: cgroup quota, cpuset, affinity) at 2 CPUs a submission, and no more than the memory
    cgroup's limit holds at ``memory_mb`` each."""
    from lab_utils import cgroups

    budget, mem = cgroups.cpu_budget(), cgroups.memory()
    jobs = max(1, budget.cpus // CPUS_PER_SUBMISSION)
    why = f"{budget.cpus} CPUs ({budget.source}) at {CPUS_PER_SUBMISSION} a submission"
    if mem.limit is not None:
        fits = max(1, mem.limit // (max(1, int(settings.memory_mb)) << 20))
        if fits < jobs:
            jobs, why = fits, (f"a memory limit of {cgroups.mb(mem.limit)} ({mem.source}) holds {fits} submission(s) "
                               f"at c.DTLabs.memory_mb={settings.memory_mb}")
    return jobs, why


def grade(labs=None, *, course_root=None, settings=None, submissions_dir=None, force=False, feedback=True,
          csv_path=None, jobs=None, out=print, progress=True, timestamps=None) -> Status:
    """Instructor batch: canary -> autograde (sandboxed, ``jobs`` at once; None: ``default_jobs``) -> merge -> CSV ->
    feedback (no hidden tests), under the command's ``settings`` (default: the course's). ``timestamps``: the
    instructor's submission times for ``submissions_dir`` (``inbox.read_timestamps``).

    DONE when every submission was graded, INCOMPLETE when some could not be (listed with the reason; the rest
    are graded and exported regardless), REFUSED when the course cannot be graded here (nothing submitted, a lab with no
    source, a canary that failed: then nothing is graded or written to the gradebook).
    """
    from lab_utils.grading.export.late import due_date

    course_root = find_course_root(course_root)
    submitted = course_root / WORK / "submitted"
    if settings is None:
        settings = course_settings(course_root)
    times, refused = None, []
    if timestamps is not None:
        if not submissions_dir:
            out("--timestamps gives the times of the submissions --submissions DIR brings in: pass both")
            return Status.REFUSED
        try:
            times = inbox.read_timestamps(timestamps)
        except ValueError as exc:
            out(f"cannot grade: {exc}")
            return Status.REFUSED
    if submissions_dir:
        src = Path(submissions_dir).resolve()
        if not src.is_dir():
            out(f"no such folder: {src}")
            return Status.REFUSED
        if src != submitted.resolve():
            notes, refused = inbox.collect(src, submitted, times)
            for note in notes:
                out(note)
    scanned = ids.scan(submitted)  # what nbgrader collect left there passes the same door
    found = scanned.found
    labs = list(labs) if labs else sorted(found)
    # refused at the door: NOT GRADED, never registered, shown escaped (a lab folder only if it is one being graded)
    refused = [r for r in dict.fromkeys(refused + scanned.refused) if r[1] is None or r[1] in labs]
    for who, lab, why in refused:
        out(f"   NOT GRADED: {who}{'/' + lab if lab else ''} ({why})")
    if not labs:
        out(f"nothing to grade: no submissions under {submitted} (layout: <student>/<NN_topic>/<NN_topic>.ipynb)")
        return Status.REFUSED
    known = discover_labs(course_root)
    unknown = [lab for lab in labs if lab not in known]
    if unknown:
        out(f"SKIPPED {unknown}: no solutions/<lab>/<lab>.ipynb source for them (known labs: {known})")
    labs = [lab for lab in labs if lab in known]
    if not labs:
        return Status.REFUSED
    if submissions_dir and times is None and any(due_date(settings, lab) for lab in labs):
        out("WARNING: a lab has a due date (c.DTLabs.due_dates), but no submission time came with --submissions: "
            "no late penalty is charged (give the times with --timestamps FILE)")
    try:
        # as a separate user, checked as that user: the course's answers and gradebooks unreadable, the venv and
        # package unwritable
        sandbox.require(settings.sandbox, course_root=course_root, user=settings.subject_user)
    except sandbox.SandboxUnavailable as exc:
        out(f"cannot grade: {exc}")
        return Status.REFUSED
    unprotected = sandbox.mode() == "unprotected"
    if unprotected:
        out("WARNING: " + sandbox.UNPROTECTED_WARNING)
        if jobs is not None and int(jobs) > 1:
            out(f"--jobs {jobs} needs a boundary: without one the course is checked between submissions, so they "
                "are graded one at a time")
        jobs = 1
    elif sandbox.mode() == "user":
        if jobs is not None and int(jobs) > 1:
            out(f"--jobs {jobs}: as the separate user {sandbox.subject_user_name()!r}, one submission runs at a time "
                "(two of one user could reach each other's processes)")
        jobs = 1
    elif jobs is None:
        jobs, why = default_jobs(settings)
        out(f"--jobs {jobs}: {why} (--jobs N to choose)")
    out(f"sandbox: {sandbox.mode()}, {jobs} at a time")
    manifest = {} if force else gradebook.read_record(course_root, MANIFEST)
    fresh = {lab: _fresh(course_root, lab, found.get(lab, []), manifest) for lab in labs}
    for lab in labs:
        skipped = len(found.get(lab, [])) - len(fresh[lab])
        out(f"== {lab}: {len(found.get(lab, []))} submission(s), {len(fresh[lab])} to grade" + (
            f" ({skipped} unchanged since last graded; --force regrades them)" if skipped else ""))
    for lab in (lab for lab in labs if fresh[lab]):  # before anything is written to the gradebook
        verdict = canary.check(course_root, lab, settings=settings, out=out)
        if not verdict.ok:
            out("REFUSED: " + verdict.explain())
            return Status.REFUSED
    scratch_dirs, todo = [], []
    for lab in labs:
        failed = record_lab(course_root, lab, force=force, settings=settings)
        if failed:
            out(failed)
            return Status.REFUSED
        gradebook.register_students(course_root, found.get(lab, []))
        missing = gradebook.without_submission(course_root, lab, found.get(lab, []))
        if missing:
            out(f"   MISSING: no submission of {lab} from {', '.join(map(ids.shown, missing))} (students of the "
                "gradebook; grades.csv gives them 0)")
        if fresh[lab]:  # the course's gradebook now holds the lab: a snapshot of it is every submission's template
            tdir = Path(grading_scratch.make("dtlabs-template-", tag=lab))
            scratch_dirs.append(tdir)
            (tdir / WORK).mkdir(parents=True)
            shutil.copy2(course_root / WORK / "gradebook.db", tdir / WORK / "gradebook.db")
            todo += [(lab, student, digest, tdir) for student, digest in fresh[lab]]

    guard = None
    if unprotected and todo:  # a boundary hides all of this from a submission; without one, put back what one changed
        work = course_root / WORK
        guard = Guard([work / "gradebook.db", work / MANIFEST, work / gradebook.SOURCES, work / outcomes.RECORD,
                       work / "submitted",
                       *{tdir for *_, tdir in todo}, course_root / "solutions", course_root / "grader", processes.PACKAGE_DIR],
                      skip=[work], watch=startup_watch())
        guard.snapshot()
    bar = None
    if progress and todo:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(todo), desc="grading", unit="submission", dynamic_ncols=True)
    batch = _Batch(course_root, manifest, guard, out, bar)
    batch.scratch_dirs += scratch_dirs
    stopped = None
    try:
        retried = set()
        while todo:
            todo = batch.run(todo, jobs, settings=settings)
            if not todo:
                break
            lab, student = todo[0][:2]
            out(f"   the sandbox failed for {student}/{lab} for a reason that is not the student's: checking the "
                "machine again before grading anyone else")
            verdict = canary.check(course_root, lab, settings=settings, force=True, out=out)
            if not verdict.ok or (lab, student) in retried:
                why = verdict.explain() if not verdict.ok else "its sandbox failed twice on a machine that grades"
                reason = Reason(Kind.ENVIRONMENT, why.splitlines()[0])
                for lab_, student_, *_ in todo:
                    batch.problems.append((lab_, student_))
                    outcomes.note(course_root, lab_, student_, graded=False, reasons=[reason])
                    out(f"   NOT GRADED: {student_}/{lab_} ({reason})")
                stopped = "STOPPED: " + why if not verdict.ok else None
                break
            retried.add((lab, student))
    except GuardError as exc:
        stopped = f"STOPPED: {exc}; grade again once the course is whole"
    finally:
        if bar is not None:
            bar.close()
        for d in batch.scratch_dirs:
            shutil.rmtree(d, ignore_errors=True)
    if stopped:
        out(stopped)
        return Status.REFUSED

    csv_path = Path(csv_path) if csv_path else course_root / WORK / "grades.csv"
    run = run_nbgrader(["export", f"--to={csv_path.resolve()}"], course_root=course_root, settings=settings,
                       timeout=300)
    out(f"grades: {csv_path}" if run.returncode == 0 else f"export failed:\n{run.output[-3000:]}")
    if feedback:
        for lab in labs:
            run = run_nbgrader(["generate_feedback", lab, "--force"], course_root=course_root, settings=settings,
                               timeout=600)
            if run.returncode != 0:
                out(f"   feedback for {lab} incomplete:\n{run.output[-2000:]}")
        out(f"feedback: {course_root / WORK / 'feedback'}")
    problems = [f"{who}{'/' + lab if lab else ''}" for who, lab, _ in refused] + [
        f"{s}/{a}" for a, s in batch.problems]
    if problems:
        out(f"{len(problems)} submission(s) could not be graded: " + ", ".join(problems))
        return Status.INCOMPLETE
    return Status.REFUSED if unknown else Status.DONE


def record_lab(course_root: Path, lab: str, *, force: bool = False, settings=None) -> str:
    """Make the course's gradebook hold ``lab`` as its source is now (``generate_assignment`` into a scratch release
    folder, so ``labs/`` is untouched); '' when it does, else what went wrong. nbgrader creates a missing gradebook
    in its own process, whose PATH has the venv's ``alembic`` (an in-process ``Gradebook`` would not, in a job)."""
    if not force and gradebook.holds_current(course_root, lab):
        return ""
    run = run_nbgrader(["generate_assignment", lab, "--force", f"--CourseDirectory.release_directory={WORK / 'release'}"],
                       course_root=course_root, settings=settings, timeout=300)
    if run.returncode != 0:
        return f"{run.output[-3000:]}\ncould not record {lab} in the gradebook (see above)"
    gradebook.note_recorded(course_root, [lab])
    return ""


def _fresh(course_root: Path, lab: str, students, manifest: dict) -> list:
    """(student, digest) of every submission of ``lab`` that is new or changed since it was last graded."""
    fresh = []
    for student in students:
        digest = inbox.submission_digest(course_root, lab, student)
        if manifest.get(f"{lab}/{student}") == digest and gradebook.cell_scores(course_root, lab, student):
            continue
        fresh.append((student, digest))
    return fresh


def autograde(lab: str, *, course_root=None, cell_timeout=None, timeout=None, force=True, echo=False):
    """One ``nbgrader autograde LAB`` over every submission of a course (tests: many "students" in one run), with
    the course's settings and ``cell_timeout`` when given.

    Each submission still runs in its own sandbox (one subject per kernel); only the gradebook is shared, so use
    ``grade`` for real classes."""
    args = ["autograde", lab] + (["--force"] if force else [])
    root = find_course_root(course_root)
    return run_nbgrader(args, course_root=root, settings=course_settings(root, cell_timeout=cell_timeout),
                        timeout=timeout, echo=echo)
