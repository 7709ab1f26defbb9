"""A class graded as a job array (Slurm): prepare once, grade one submission per task, merge once.

``dtlabs grade`` runs every step in one process; on a cluster the steps run on different nodes at different times,
so each leaves its state in a results folder on a filesystem every node sees::

    RESULTS/<lab>/roster.txt              line i: the student array task i grades (``prepare``; without one, a
                                          merge expects everyone who submitted the lab)
    RESULTS/<lab>/missing.txt             students named to ``prepare`` with no submission: the merge reports them
    RESULTS/<lab>/template/               the course's gradebook holding the lab, snapshotted once (``prepare``)
    RESULTS/<lab>/<student>/task.json     which task graded it, where and when it started (``grade_one``)
    RESULTS/<lab>/<student>/result.json   its points and reasons, written last and atomically (``grade_one``)
    RESULTS/<lab>/<student>/scratch/      its private scratch course, autograded notebook included
    RESULTS/logs/                         the tasks' Slurm logs (grader/slurm/grade-class.sh sets --output)

Only ``prepare`` and ``merge`` write the course (its gradebook and ``graded.json``), each from one process; a task
writes nothing but its own folder. A task that is rerun or requeued starts from an empty folder, so a crash
leaves no result rather than an old one. ``merge`` expects every student of the roster: one whose task never
wrote a result (cancelled, out of time, node lost) is NOT GRADED with what its task record and log say, never
missing, unless the gradebook already holds the grade of that very submission (``dtlabs grade`` or an earlier
merge graded it, and it has not changed since), which then stands. It records what it merged in ``graded.json`` as
``dtlabs grade`` does, so a later ``dtlabs grade`` regrades only what the array did not grade.

Every student id passes the door of ``boundary.ids`` first (``prepare``, ``grade_one``, ``merge``): one that breaks
the rule is NOT GRADED, printed escaped, and never becomes a roster line, a folder or a gradebook row. A named
student without a submission is reported missing; the rest of the class is prepared and graded.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import time
from pathlib import Path

from lab_utils.grading import canary, gradebook, outcomes
from lab_utils.grading.boundary import ids, sandbox
from lab_utils.grading.batch import MANIFEST, record_lab
from lab_utils.grading.boundary.inbox import submission_digest
from lab_utils.grading.course import WORK, GradingError, discover_labs, submissions
from lab_utils.grading.nbgrader_run import course_settings
from lab_utils.grading.outcomes import Kind, Reason, of_kind
from lab_utils.grading.submission import grade_submission, prepare_template
from lab_utils.status import Status

ROSTER = "roster.txt"
MISSING = "missing.txt"
RESULT = "result.json"
TASK = "task.json"


def _write_json(path: Path, data: dict) -> None:
    """Replace ``path`` atomically: a task killed while writing leaves the old file or none, never half of one."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _read_lines(path: Path) -> list[str]:
    """The non-empty lines of ``path`` ([] when it is missing); ``OSError`` when it cannot be read."""
    if not path.is_file():
        return []
    return [line.strip() for line in path.read_text().splitlines() if line.strip()]


def read_roster(results: Path, lab: str) -> list[str]:
    path = Path(results) / lab / ROSTER
    try:
        return [line.strip() for line in path.read_text().splitlines() if line.strip()]
    except OSError:
        raise GradingError(f"no roster at {path}: run `dtlabs prepare-array {lab} --out {results}` first") from None


def expected_students(course_root: Path, results: Path, lab: str) -> list[str]:
    """Whom a merge must account for: the roster the array was given, else everyone who submitted the lab."""
    if (Path(results) / lab / ROSTER).is_file():
        return read_roster(results, lab)
    return submissions(course_root).get(lab, [])


# ------------------------------------------------------------------------------------------ prepare (login node)
def prepare(course_root: Path, lab: str, results: Path, students=None, settings=None, out=print) -> list[str]:
    """Record ``lab`` in the course's gradebook, snapshot it as every task's template, write the roster.

    ``students`` defaults to everyone with a submission of ``lab``. A named student whose id breaks the rule is NOT
    GRADED, one without a submission is missing (``missing.txt``, for the merge): both are said through ``out`` and
    left off the roster, and the rest are prepared. Returns the roster (task i grades line i)."""
    course_root, results = Path(course_root).resolve(), Path(results).resolve()
    if lab not in discover_labs(course_root):
        raise GradingError(f"no solutions/{lab}/{lab}.ipynb in {course_root} (labs: {discover_labs(course_root)})")
    scanned = ids.scan(course_root / WORK / "submitted")
    for who, lab_, why in scanned.refused:
        if lab_ in (None, lab):
            out(f"NOT GRADED: {who}{'/' + lab_ if lab_ else ''} ({why})")
    submitted = scanned.found.get(lab, [])
    named = list(dict.fromkeys(students or []))
    bad = ids.refusals(named)
    for student in named:
        if student in bad:
            out(f"NOT GRADED: {ids.shown(student)}/{lab} ({bad[student]})")
    missing = [s for s in named if s not in bad and s not in submitted]
    for student in missing:
        out(f"MISSING: {student}/{lab} (no submission under {course_root / WORK / 'submitted' / student / lab})")
    roster = [s for s in named if s not in bad and s not in missing] if students else submitted
    if not roster:
        raise GradingError(f"nothing to grade: no submission of {lab} under {course_root / WORK / 'submitted'}" +
                           (" from the students named" if students else ""))
    failed = record_lab(course_root, lab, settings=settings)
    if failed:
        raise GradingError(failed)
    labdir = results / lab
    template = labdir / "template"
    shutil.rmtree(template, ignore_errors=True)
    (template / WORK).mkdir(parents=True)
    shutil.copy2(course_root / WORK / "gradebook.db", template / WORK / "gradebook.db")
    (template / "source.sha256").write_text(gradebook.source_digest(course_root, lab))
    (labdir / ROSTER).write_text("".join(f"{s}\n" for s in roster))
    (labdir / MISSING).unlink(missing_ok=True)
    if missing:
        (labdir / MISSING).write_text("".join(f"{s}\n" for s in missing))
    (results / "logs").mkdir(parents=True, exist_ok=True)
    return roster


# ------------------------------------------------------------------------------------------ one task (compute node)
def _task_record() -> dict:
    env = os.environ
    job = env.get("SLURM_ARRAY_JOB_ID") or env.get("SLURM_JOB_ID")
    task = env.get("SLURM_ARRAY_TASK_ID")
    return {"job": f"{job}_{task}" if job and task else job, "host": socket.gethostname(), "pid": os.getpid(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S")}


def grade_one(course_root: Path, lab: str, results: Path, *, student: str | None = None, task: int | None = None,
              settings=None, out=print) -> Status:
    """Grade one submission into ``RESULTS/<lab>/<student>/`` (the student, or roster line ``task``), under the
    command's ``settings`` (default: the course's).

    DONE graded, INCOMPLETE not graded (the reason is in result.json and printed), REFUSED bad arguments (an id
    that breaks the rule among them)."""
    course_root, results = Path(course_root).resolve(), Path(results).resolve()
    if settings is None:
        settings = course_settings(course_root)
    labdir = results / lab
    if student is None:
        roster = read_roster(results, lab)
        if task is None or not 0 <= task < len(roster):
            out(f"task {task} is not a line of {labdir / ROSTER} ({len(roster)} students: tasks 0-{len(roster) - 1})")
            return Status.REFUSED
        student = roster[task]
    why = ids.problem(student) or (f"the student id names a file of the results folder ({student})"
                                   if student in ("template", ROSTER, MISSING) else None)
    if why:  # never a folder, never a result: said escaped
        out(f"{ids.shown(student)}/{lab}: NOT GRADED - {why}")
        return Status.REFUSED
    sdir = labdir / student
    # a rerun or a requeued task starts clean: the old result goes first, so a crash cannot leave it behind
    (sdir / RESULT).unlink(missing_ok=True)
    for sub in ("scratch", "template"):
        shutil.rmtree(sdir / sub, ignore_errors=True)
    sdir.mkdir(parents=True, exist_ok=True)
    record = _task_record()
    _write_json(sdir / TASK, record)
    reasons: list[Reason] = []
    try:
        # no boundary on this node: it grades no one
        sandbox.require(settings.sandbox, course_root=course_root, user=settings.subject_user)
    except sandbox.SandboxUnavailable as exc:
        reasons.append(Reason(Kind.ENVIRONMENT, f"cannot grade on {record['host']}: {exc}"))
    if not reasons and sandbox.mode() == "unprotected":
        print("WARNING: " + sandbox.UNPROTECTED_WARNING, file=sys.stderr, flush=True)
    if not of_kind(reasons, Kind.ENVIRONMENT):
        # as `dtlabs grade` does: this node grades no one until the lab's solution and release grade right here
        # (the first task of a user on a node grades them; the others read its verdict)
        verdict = canary.check(course_root, lab, settings=settings, out=out)
        if not verdict.ok:
            reasons.append(Reason(Kind.ENVIRONMENT, f"cannot grade on {record['host']}: {verdict.explain()}"))
    result = {"lab": lab, "student": student, "graded": False, "points": [0, 0], "reasons": [], **record}
    if not of_kind(reasons, Kind.ENVIRONMENT):
        try:
            graded = _grade(course_root, lab, student, labdir, sdir, settings, out)
            reasons += graded.pop("reasons")
            result.update(graded)
        except Exception as exc:  # noqa: BLE001 - the reason goes into the result and the log, never a silent zero
            reasons.append(Reason(Kind.COURSE, f"grading failed: {type(exc).__name__}: {exc}"))
    result["reasons"] = [str(r) for r in reasons]  # result.json holds their text, as the grade lines show it
    result["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    _write_json(sdir / RESULT, result)
    got, possible = result["points"]
    out(f"{student}/{lab}: " + (f"{got:g}/{possible:g}" if result["graded"] else "NOT GRADED") +
        (f" - {'; '.join(result['reasons'])}" if result["reasons"] else ""))
    return Status.DONE if result["graded"] else Status.INCOMPLETE


def _grade(course_root: Path, lab: str, student: str, labdir: Path, sdir: Path, settings, out) -> dict:
    """The grading itself, with the template prepared once (or this task's own when there is none or it is stale)."""
    scanned = ids.scan(course_root / WORK / "submitted")  # the door dtlabs grade and prepare use
    if student not in scanned.found.get(lab, []):
        why = next((w for who, lab_, w in scanned.refused if who == student and lab_ in (None, lab)), None)
        raise GradingError(why or f"no submission at {course_root / WORK / 'submitted' / student / lab}")
    template = labdir / "template"
    stamp = template / "source.sha256"
    if not (stamp.is_file() and stamp.read_text() == gradebook.source_digest(course_root, lab)):
        out(f"{lab}: no current template under {template} (dtlabs prepare-array); building a private one")
        template = prepare_template(course_root, lab, sdir / "template", settings=settings)
    digest = submission_digest(course_root, lab, student)
    res = grade_submission(course_root, lab, student, template, settings=settings, scratch=sdir / "scratch")
    # the machine's fault (its sandbox never started) is never a grade: NOT GRADED, with the reason
    return {"template": str(template), "digest": digest, "graded": res.graded and not res.environment,
            "points": list(res.points), "reasons": res.reasons, "seconds": round(res.seconds, 1)}


# ------------------------------------------------------------------------------------------ merge (one process)
def _log_tail(results: Path, job: str | None, n: int = 3) -> str:
    """The last lines of a task's Slurm log (``RESULTS/logs/*-<job>.out``), where Slurm says why it ended one."""
    if not job:
        return ""
    for log in sorted((results / "logs").glob(f"*-{job}.out")):
        try:
            lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
        except OSError:
            continue
        return f"; its log {log}" + (f" ends: {' | '.join(lines[-n:])}" if lines else " is empty")
    return ""


def missing_reason(results: Path, lab: str, student: str) -> str:
    """Why a student of the roster has no result, in words for the grade line."""
    task = _read_json(Path(results) / lab / student / TASK)
    if task is None:
        return "no result: no array task started for this student (cancelled before it ran, or never submitted)"
    return (f"no result: array task {task.get('job') or '?'} started on {task.get('host')} at {task.get('started')} "
            "and never finished (cancelled, out of time, or its node was lost)" + _log_tail(Path(results), task.get("job")))


def merge(course_root: Path, results: Path, labs=None, settings=None, out=print) -> Status:
    """Every roster of ``results`` (or of ``labs``) merged into the course's gradebook.

    DONE every student merged, INCOMPLETE some NOT GRADED (each listed with the reason), REFUSED nothing to
    merge."""
    course_root, results = Path(course_root).resolve(), Path(results).resolve()
    known = discover_labs(course_root)
    labs = list(labs) if labs else sorted(p.name for p in results.iterdir() if p.is_dir() and p.name in known) \
        if results.is_dir() else []
    if not labs:
        out(f"nothing to merge: no <lab>/ folder under {results} (grader/slurm/grade-class.sh or `dtlabs grade-one` "
            "writes one)")
        return Status.REFUSED
    bad, merged, kept = [], 0, 0
    for lab in labs:
        roster = expected_students(course_root, results, lab)
        if not roster:
            out(f"nothing to merge for {lab}: no roster under {results / lab} and no submission of it")
            return Status.REFUSED
        failed = record_lab(course_root, lab, settings=settings)  # a gradebook without the lab gets it first
        if failed:
            out(failed)
            return Status.REFUSED
        refused = ids.refusals(roster)  # a roster edited by hand passes the door too
        gradebook.register_students(course_root, [s for s in roster if s not in refused])
        manifest = gradebook.read_record(course_root, MANIFEST)
        out(f"== {lab}: {len(roster)} student(s) to merge from {results / lab}")
        for student, why in refused.items():
            bad.append(f"{lab}/{ids.shown(student)}")
            out(f"   NOT GRADED: {ids.shown(student)}/{lab} ({why})")
        for student in _read_lines(results / lab / MISSING):
            if gradebook.cell_scores(course_root, lab, student):
                continue  # it came later, and is graded
            bad.append(f"{lab}/{ids.shown(student)}")
            out(f"   MISSING: {ids.shown(student)}/{lab} (named to prepare-array, but no submission)")
        for student in (s for s in roster if s not in refused):
            sdir = results / lab / student
            info = _read_json(sdir / RESULT)
            key = f"{lab}/{student}"
            if not (info or {}).get("graded") and manifest.get(key) == submission_digest(course_root, lab, student) \
                    and gradebook.cell_scores(course_root, lab, student):
                kept += 1  # graded since (dtlabs grade, an earlier merge) and unchanged: that grade stands
                out(f"   {student}/{lab}: kept the grade of the unchanged submission (no new result in {sdir})")
                continue
            if info is None:
                why = missing_reason(results, lab, student)
            elif not info.get("graded"):
                why = "; ".join(info.get("reasons") or []) or "nbgrader produced no grade; see the task's log"
            elif not gradebook.merge(course_root, sdir / "scratch", lab, student):
                why = f"its result says graded, but {sdir / 'scratch'} holds no graded submission"
            else:
                manifest[key] = info.get("digest")
                merged += 1
                got, possible = info["points"]
                outcomes.note(course_root, lab, student, graded=True, points=info["points"],
                              reasons=info.get("reasons") or [], seconds=info.get("seconds"))
                line = f"   {student}/{lab}: {got:g}/{possible:g}"
                if info.get("reasons") or got == 0:
                    line += f" - {'; '.join(info.get('reasons') or []) or 'no test passed'}"
                out(line)
                continue
            manifest.pop(key, None)
            bad.append(key)
            outcomes.note(course_root, lab, student, graded=False, reasons=[why],
                          seconds=(info or {}).get("seconds"))
            out(f"   NOT GRADED: {student}/{lab} ({why})")
        gradebook.write_record(course_root, MANIFEST, manifest)
    out(f"merged {merged} of {merged + kept + len(bad)}" + (f", kept {kept}" if kept else "") +
        (f"; NOT GRADED or missing: {', '.join(bad)}" if bad else ""))
    return Status.INCOMPLETE if bad else Status.DONE
