"""Reading and writing nbgrader's gradebook: scores of a submission, and a sandboxed run's result merged in.

Each submission is graded in its own scratch course (its own copy of the gradebook), so several can run at
once and nothing a submission does reaches the course's gradebook. When the sandbox is gone, ``merge`` copies
the scratch result into the course: the autograded notebook (and nothing else the submission held) into
``autograded/`` and the scores (with nbgrader's late-submission penalty and the due date it was charged against) into the
gradebook through nbgrader's own API, which keeps the CSV export, feedback and the formgrader working as usual.
"""
from __future__ import annotations

import csv
import hashlib
import json
import os
import shutil
import warnings
from pathlib import Path

from lab_utils.grading.course import WORK


def db_url(course_root: Path | str) -> str:
    return "sqlite:///" + str(Path(course_root).resolve() / WORK / "gradebook.db")


def cell_scores(course_root: Path | str, lab: str, student: str, *, auto: bool = False) -> dict:
    """grade_id -> (score, max_score) of every graded cell of one autograded submission ({} if none).

    ``auto``: the scores autograde computed, ignoring manual ones. A scratch course's gradebook must be read so: its
    manual scores come from nobody but a submission that wrote the file while it ran (where no sandbox stops it),
    and ``merge`` copies the autograde scores alone."""
    from nbgrader.api import Gradebook, MissingEntry

    out = {}
    with Gradebook(db_url(course_root)) as gb:
        try:
            sub = gb.find_submission(lab, student)
        except MissingEntry:
            return {}
        for nb in sub.notebooks:
            for g in nb.grades:
                out[g.name] = (float((g.auto_score if auto else g.score) or 0.0), float(g.max_score))
    return out


def expected_dates(template_root: Path | str, lab: str, submitted: Path, due) -> tuple:
    """(submission time, due date) a submission must still have in its scratch gradebook after it ran: the time of
    the ``timestamp.txt`` it was collected with, and ``due`` (the course's, ``late.due_date``), else the template's
    due date. Read before the submission runs: without a sandbox it could change those files too."""
    from nbgrader.api import Gradebook, MissingEntry
    from nbgrader.utils import parse_utc

    stamp = Path(submitted) / "timestamp.txt"
    text = stamp.read_text().strip() if stamp.is_file() and not stamp.is_symlink() else ""
    try:
        when = parse_utc(text) if text else None
    except ValueError:  # nbgrader refuses that submission itself, with the file's name
        when = None
    if due:
        return when, due
    with Gradebook(db_url(template_root)) as gb:
        try:
            return when, gb.find_assignment(lab).duedate
        except MissingEntry:
            return when, None


def tampering(scratch_root: Path | str, lab: str, student: str, expected: tuple) -> list[str]:
    """What a submission changed in the scratch gradebook it was graded in, possible only where no sandbox hides the
    file (unprotected): scores autograde never writes (manual, extra credit), its submission time or the lab's due
    date (``expected``: ``expected_dates``). Each would change its grade or its late penalty."""
    from nbgrader.api import Gradebook, MissingEntry

    expected_time, expected_due = expected
    found = []
    with Gradebook(db_url(scratch_root)) as gb:
        try:
            sub = gb.find_submission(lab, student)
        except MissingEntry:
            return []
        forged = sorted(g.name for nb in sub.notebooks for g in nb.grades
                        if g.manual_score is not None or g.extra_credit)
        if forged:
            found.append(f"scores autograde never writes (manual, extra credit) on {', '.join(forged)}")
        if expected_time is not None and sub.timestamp != expected_time:
            found.append(f"its submission time ({sub.timestamp}, collected as {expected_time})")
        if sub.assignment.duedate != expected_due:
            found.append(f"the due date ({sub.assignment.duedate}, the course's is {expected_due})")
    return [f"it changed the gradebook it was graded in: {what}" for what in found]


def schema(db_path: Path | str) -> set:
    """Every table, index, view and trigger of an SQLite file, read without letting it run anything: opened read-only
    (a trigger fires on writes only), ``sqlite_master`` alone is read."""
    import sqlite3

    con = sqlite3.connect(f"file:{Path(db_path).resolve()}?mode=ro", uri=True)
    try:
        return {tuple(row) for row in con.execute("SELECT type, name, tbl_name, sql FROM sqlite_master")}
    finally:
        con.close()


def schema_changes(scratch_root: Path | str, made: set) -> list[str]:
    """What a submission added to (or changed in) the schema of the scratch gradebook it was graded in, against
    ``made`` (the template's ``schema``, read before the submission ran: unprotected, it could add the same trigger to
    the template): a trigger that rewrites the scores autograde writes, a view, a table. Read before any score is: a
    score from such a gradebook is no grade."""
    path = Path(scratch_root) / WORK / "gradebook.db"
    try:
        found = schema(path)
    except Exception as exc:  # noqa: BLE001 - not an SQLite file any more: that is a change too
        return [f"it changed the gradebook it was graded in: it is no longer readable ({type(exc).__name__})"]
    added = sorted(f"{kind} {name!r}" for kind, name, _, _ in found - made)
    gone = sorted(f"{kind} {name!r}" for kind, name, _, _ in made - found)
    return [f"it changed the gradebook it was graded in: " + "; ".join(
        (["added " + ", ".join(added)] if added else []) + (["removed or altered " + ", ".join(gone)] if gone else []))
    ] if added or gone else []


SOURCES = "gradebook-sources.json"  # lab -> digest of the source notebook the gradebook last recorded


def read_record(course_root: Path | str, name: str) -> dict:
    """A JSON record of the course's grading work folder ({} when missing or unreadable)."""
    try:
        return json.loads((Path(course_root) / WORK / name).read_text())
    except (OSError, ValueError):
        return {}


def write_record(course_root: Path | str, name: str, data: dict) -> None:
    """Replace a JSON record of the grading work folder atomically (a killed run leaves the old one whole)."""
    path = Path(course_root) / WORK / name
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, path)


def source_digest(course_root: Path | str, lab: str) -> str:
    return hashlib.sha256((Path(course_root) / "solutions" / lab / f"{lab}.ipynb").read_bytes()).hexdigest()


def holds_current(course_root: Path | str, lab: str) -> bool:
    """Whether the gradebook already holds ``lab`` as its source is now (``generate_assignment`` would change
    nothing, and costs an nbgrader process: ``grade`` skips it then)."""
    from nbgrader.api import Gradebook, MissingEntry

    if read_record(course_root, SOURCES).get(lab) != source_digest(course_root, lab):
        return False
    if not (Path(course_root) / WORK / "gradebook.db").is_file():
        return False
    with Gradebook(db_url(course_root)) as gb:
        try:
            gb.find_assignment(lab)
        except MissingEntry:
            return False
    return True


def note_recorded(course_root: Path | str, labs) -> None:
    """``generate_assignment`` just recorded ``labs`` in the course's gradebook from their current source."""
    recorded = read_record(course_root, SOURCES)
    recorded.update({lab: source_digest(course_root, lab) for lab in labs})
    write_record(course_root, SOURCES, recorded)


def register_students(course_root: Path | str, students) -> None:
    """Every submitter gets a gradebook row, so the CSV lists even a submission nbgrader could not read."""
    from nbgrader.api import Gradebook

    with Gradebook(db_url(course_root)) as gb:
        for s in students:
            gb.update_or_create_student(s)


def without_submission(course_root: Path | str, lab: str, submitters) -> list[str]:
    """The gradebook's students who have no submission of ``lab`` among ``submitters`` and no grade of it: missing
    (nbgrader's CSV gives them 0, which must not read as a grade)."""
    from nbgrader.api import Gradebook, MissingEntry

    submitters = set(submitters)
    out = []
    with Gradebook(db_url(course_root)) as gb:
        for student in gb.students:
            if student.id in submitters:
                continue
            try:
                gb.find_submission(lab, student.id)
            except MissingEntry:
                out.append(student.id)
    return sorted(out)


EXCHANGE_FILES = ("timestamp.txt", "submission_secret.txt")  # what `nbgrader submit` adds beside a notebook


def merge(course_root: Path | str, scratch_root: Path | str, lab: str, student: str) -> bool:
    """Copy one graded submission from its scratch course into the course. False if it was never graded."""
    from nbgrader.api import Gradebook, MissingEntry

    course_root, scratch_root = Path(course_root).resolve(), Path(scratch_root).resolve()
    src_dir = scratch_root / WORK / "autograded" / student / lab
    with Gradebook(db_url(scratch_root)) as sgb:
        try:
            ssub = sgb.find_submission(lab, student)
        except MissingEntry:
            return False
        grades = {(nb.name, g.name): (g.auto_score, g.needs_manual_grade) for nb in ssub.notebooks for g in nb.grades}
        comments = {(nb.name, c.name): c.auto_comment for nb in ssub.notebooks for c in nb.comments}
        penalties = {nb.name: nb.late_submission_penalty for nb in ssub.notebooks}  # nbgrader's late-submission plugin
        timestamp, duedate = ssub.timestamp, ssub.assignment.duedate
    dest_dir = course_root / WORK / "autograded" / student / lab
    if dest_dir.exists():
        shutil.rmtree(dest_dir)
    dest_dir.mkdir(parents=True)
    notebook = src_dir / f"{lab}.ipynb"  # only the autograded notebook comes back (never a file the submission holds)
    if notebook.is_file() and not notebook.is_symlink():
        shutil.copyfile(notebook, dest_dir / notebook.name, follow_symlinks=False)
    # nbgrader's exchange releases feedback only beside the submission's timestamp and secret (generate_feedback
    # copies them from autograded/, release_feedback reads them): the collected ones, small plain files or nothing
    collected = course_root / WORK / "submitted" / student / lab
    for name in EXCHANGE_FILES:
        f = collected / name
        if f.is_file() and not f.is_symlink() and f.stat().st_size <= 4096:
            shutil.copyfile(f, dest_dir / name, follow_symlinks=False)
    with warnings.catch_warnings(), Gradebook(db_url(course_root)) as gb:
        warnings.simplefilter("ignore")  # SQLAlchemy's autoflush notes while nbgrader replaces a submission
        gb.update_or_create_student(student)
        if duedate is not None:  # the due date the penalty was charged against (c.DTLabs.due_dates, late.DueDates)
            gb.update_or_create_assignment(lab, duedate=duedate)
        try:
            gb.remove_submission(lab, student)  # a resubmission replaces the old grades, never silently keeps them
            gb.db.commit()
        except MissingEntry:
            pass
        gb.add_submission(lab, student, timestamp=timestamp)
        for (nb_name, gid), (score, manual) in grades.items():
            g = gb.find_grade(gid, nb_name, lab, student)
            g.auto_score = score
            g.needs_manual_grade = manual
        for (nb_name, cid), text in comments.items():
            try:
                gb.find_comment(cid, nb_name, lab, student).auto_comment = text
            except MissingEntry:
                pass
        for nb_name, penalty in penalties.items():
            try:
                gb.find_submission_notebook(nb_name, lab, student).late_submission_penalty = penalty
            except MissingEntry:
                pass
        gb.db.commit()
    return True


def read_grades_csv(path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))
