"""The Canvas export (an nbgrader ExportPlugin, `dtlabs export canvas` and `nbgrader export --exporter=...`) on a
graded class (conftest.graded_class), and nbgrader's due dates and late-submission plugin behind its scores.

What they protect: the CSV is the shape Canvas's gradebook import takes (the roster's five identity columns, a
column per lab titled as in the roster, the Points Possible row); students are matched by login; nobody is dropped
silently (gradebook students missing from the roster, roster students missing from the gradebook, NOT GRADED
submissions: on stderr); a late submission loses what the course's late-submission plugin says, in every export.
"""
from __future__ import annotations

import csv

import pytest
from helpers.synthetic import SYNTHETIC_LAB as LAB

from lab_utils import cli, grading
from lab_utils.grading.export import canvas
from lab_utils.grading.nbgrader_run import run_nbgrader

pytestmark = pytest.mark.xdist_group("graded-class")  # one worker grades the class the export and report tests share

TITLE = f"{LAB} (4411)"  # Canvas appends its assignment id to a title in its exports
ROSTER = (
    "\ufeffStudent,ID,SIS User ID,SIS Login ID,Section,Homework 1 (4400),{title},Current Score\n"
    "    Points Possible,,,,,10.00,3.00,(read only)\n"
    '"Ann, A",101,s101,ANN,Section 1,8,,80\n'
    '"Cat, C",103,s103,cat,Section 1,,,\n'
    '"Dan, D",104,s104,dan,Section 2,,,\n'
    '"Eve, E",105,s105,eve,Section 2,,,\n'
    '"Gus, G",107,s107,gus,Section 2,,,\n'
    "Test Student,999,,,Section 1,,,\n"
)


def _read(path):
    with open(path, newline="", encoding="utf-8-sig") as fh:
        return list(csv.reader(fh))


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_canvas_csv_round_trips_through_a_roster_with_a_missing_and_an_extra_student(graded_class, tmp_path, capsys):
    roster = tmp_path / "roster.csv"
    roster.write_text(ROSTER.format(title=TITLE), encoding="utf-8")
    out = tmp_path / "canvas.csv"
    assert cli.main(["export", "canvas", "--roster", str(roster), "--out", str(out),
                     "--course-root", str(graded_class)]) == 0
    err = capsys.readouterr().err
    rows = _read(out)
    assert rows[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", TITLE], rows[0]
    assert rows[1][0].strip() == "Points Possible" and rows[1][1:] == ["", "", "", "", "3"], rows[1]
    got = {r[3]: r for r in rows[2:]}
    assert [r[0] for r in rows[2:]] == ["Ann, A", "Cat, C", "Dan, D", "Eve, E", "Gus, G", "Test Student"], (
        "every roster student keeps its row, in the roster's order")
    assert got["ANN"] == ["Ann, A", "101", "s101", "ANN", "Section 1", "3"], "matched by login, case aside"
    assert got["cat"][-1] == "1", "the known-wrong answer loses test_add's 2 points"
    assert got["eve"][-1] == "2", "6 hours late: the course's plugin takes one point per started day"
    assert got["dan"][-1] == "" and got["gus"][-1] == "" and rows[-1][-1] == "", "no grade: blank, not 0"
    # nobody dropped silently
    assert "in the gradebook but not in the roster" in err and "bob (" in err, err
    assert "in the roster but not in the gradebook" in err and "Gus, G" in err and "Test Student" in err, err
    assert f"NOT GRADED, left blank: dan/{LAB}" in err and "invalid notebook" in err, err
    assert f"late: eve/{LAB} 3 - 1 late penalty = 2" in err, err

    # the file is itself a roster Canvas could have exported: exporting through it again changes nothing
    again = tmp_path / "again.csv"
    assert cli.main(["export", "canvas", "--roster", str(out), "--out", str(again),
                     "--course-root", str(graded_class)]) == 0
    assert _read(again) == rows

    # nbgrader's own command line, with the plugin and the course config, writes the same file
    by_nbgrader = tmp_path / "nbgrader.csv"
    run = run_nbgrader(["export", "--exporter=lab_utils.grading.export.canvas.CanvasExporter",
                        f"--CanvasExporter.roster={roster}", f"--to={by_nbgrader}"], course_root=graded_class,
                       timeout=300)
    assert run.returncode == 0, run.output[-3000:]
    assert _read(by_nbgrader) == rows
    assert "in the gradebook but not in the roster" in run.output and f"NOT GRADED, left blank: dan/{LAB}" in run.output


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_late_penalty_from_the_course_config_shows_in_nbgraders_own_export_too(graded_class, tmp_path):
    """The due date (c.DTLabs.due_dates) and the plugin (c.AssignLatePenalties.plugin_class) act in the scratch
    course each submission is graded in; `merge` must carry the penalty and the due date into the course."""
    out = tmp_path / "grades.csv"
    run = run_nbgrader(["export", f"--to={out}"], course_root=graded_class, timeout=300)
    assert run.returncode == 0, run.output[-3000:]
    rows = {r["student_id"]: r for r in grading.read_grades_csv(out)}
    assert float(rows["eve"]["raw_score"]) == 3.0 and float(rows["eve"]["late_submission_penalty"]) == 1.0
    assert float(rows["eve"]["score"]) == 2.0
    assert float(rows["ann"]["late_submission_penalty"]) == 0.0, "on time: no penalty"
    assert rows["eve"]["duedate"].startswith("2030-01-10 12:00:00"), rows["eve"]


def test_column_titles_follow_the_roster_and_the_course_config():
    columns = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "01_ddp_setup (77)", "Lab 2: accumulation (78)"]
    assert canvas.column_title("01_ddp_setup", columns, {}) == "01_ddp_setup (77)", "the roster's title, with its id"
    assert canvas.column_title("02_grad_accumulation", columns, {"02_grad_accumulation": "Lab 2: accumulation"}) == (
        "Lab 2: accumulation (78)"), "c.DTLabs.canvas_columns names the roster's column"
    assert canvas.column_title("03_fsdp_zero", columns, {}) == "03_fsdp_zero", "a lab Canvas has not seen: a new column"


def test_a_roster_that_is_not_a_canvas_export_is_refused_with_the_reason(tmp_path):
    bad = tmp_path / "names.csv"
    bad.write_text("name,email\nann,ann@example.org\n")
    with pytest.raises(canvas.RosterError, match="not a Canvas gradebook export: no column Student"):
        canvas.read_roster(bad)
    twice = tmp_path / "twice.csv"
    twice.write_text("Student,ID,SIS User ID,SIS Login ID,Section\nA,1,,ann,S\nB,2,,ANN,S\n")
    with pytest.raises(canvas.RosterError, match="names the SIS Login ID 'ANN' twice"):
        canvas.read_roster(twice)
    with pytest.raises(canvas.RosterError, match="cannot read the roster"):
        canvas.read_roster(tmp_path / "missing.csv")
