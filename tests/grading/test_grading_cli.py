"""`dtlabs grade` and `dtlabs validate` on a tiny synthetic course (seconds per notebook, no torch), so these
tests never wait for a real lab. What they protect: one broken or hanging submission never stops the batch,
the CSV lists every student, feedback never shows hidden tests, nothing a submission started survives
grading, and validation has a real exit code."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import nbformat
import pytest
from helpers.synthetic import HIDDEN_SOURCE, SYNTHETIC_LAB as LAB

from helpers.known_wrong import known_wrong

from lab_utils import cli, grading
from lab_utils.grading.quality.swaps import Swap, check_swaps, release_swap
from lab_utils.grading.validate import _wrap_error


def _notebooks(root):
    rel = nbformat.read(str(root / "labs" / LAB / f"{LAB}.ipynb"), as_version=4)
    src = nbformat.read(str(root / "solutions" / LAB / f"{LAB}.ipynb"), as_version=4)
    return rel, src


def _write(folder: Path, student: str, nb) -> None:
    dest = folder / student / LAB / f"{LAB}.ipynb"
    dest.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(dest))


# A cell that starts a process in its own session (as torchrun does): it outlives the kernel unless grading ends it
# (the no_leaked_processes fixture finds it by the test's token, which the sandbox passes on).
ORPHAN = textwrap.dedent("""
    import subprocess, sys
    _p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
""")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_grade_batch_survives_broken_and_hanging_submissions(synthetic_course, tmp_path, no_leaked_processes, capsys):
    root = tmp_path / "course"
    shutil.copytree(synthetic_course, root)
    rel, src = _notebooks(root)
    inbox = tmp_path / "inbox"
    wrong = known_wrong(LAB, root)[0]
    _write(inbox, "good", grading.fill_solutions(rel, src))
    _write(inbox, "stub", rel)
    _write(inbox, "wrong", grading.fill_solutions(rel, src, {wrong.replaces: wrong.source}))
    # hangs where SIGINT is ignored, so the interrupt does not help: the per-cell timeout ends the student's process
    _write(inbox, "hangs", grading.fill_solutions(rel, src, {
        "add": "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    time.sleep(1)"}))
    leaky = grading.fill_solutions(rel, src)
    leaky.cells[2].source = ORPHAN + "\n" + leaky.cells[2].source
    _write(inbox, "leaky", leaky)
    (inbox / "broken" / LAB).mkdir(parents=True)
    (inbox / "broken" / LAB / f"{LAB}.ipynb").write_text("{ this is not a notebook")

    csv_path = tmp_path / "grades.csv"
    rc = cli.main(["grade", "--submissions", str(inbox), "--timeout", "5", "--csv", str(csv_path),
                   "--course-root", str(root)])
    out = capsys.readouterr().out

    assert rc == 1, f"one submission is unreadable, so grade must say so (exit 1):\n{out}"
    assert "NOT GRADED: broken" in out, out
    rows = {r["student_id"]: r for r in grading.read_grades_csv(csv_path)}
    assert set(rows) == {"good", "stub", "wrong", "hangs", "leaky", "broken"}, rows
    score = {s: float(r["score"]) for s, r in rows.items()}
    assert score["good"] == score["leaky"] == float(rows["good"]["max_score"]) == 3.0, score
    assert score["stub"] == score["hangs"] == score["broken"] == 0.0, score
    hangs = next(line for line in out.splitlines() if "hangs/" in line)
    assert "did not stop" in hangs, f"the zero must say why: {hangs}"
    assert score["wrong"] == 1.0, "ignores_sign fails only the hidden part of test_add (2 of 3 points)"

    # the process a submission left in its own session is gone: no_leaked_processes checks it after the test

    # feedback exists for every graded student and never shows hidden-test source
    feedback = root / "grader" / "work" / "feedback"
    pages = sorted(feedback.glob(f"*/{LAB}/{LAB}.html"))
    assert {p.parts[-3] for p in pages} == {"good", "stub", "wrong", "leaky", "hangs"}, out
    for page in pages:
        html = page.read_text()
        assert "BEGIN HIDDEN TESTS" not in html and "add(-1, 1)" not in html, f"hidden test source in {page}"
        assert "add(1, 2) should be 3" in html  # ... while the visible test is shown
    wrong_page = (feedback / "wrong" / LAB / f"{LAB}.html").read_text()
    assert "add is wrong for negative or fractional numbers" in wrong_page, "the hidden check's message is for students"
    # the autograded notebook (instructor side) still has them: proof the leak was real and is handled
    assert HIDDEN_SOURCE in (root / "grader/work/autograded/wrong" / LAB / f"{LAB}.ipynb").read_text()

    # the swap session (how test_labs.py and `dtlabs mutate` prove a lab's tests) gives every cell the verdict that
    # grading each submission alone just gave
    session = check_swaps(LAB, [release_swap(LAB, root), Swap("wrong", {wrong.replaces: wrong.source})], root=root)
    alone = {s: grading.cell_scores(root, LAB, s) for s in ("good", "stub", "wrong")}
    assert session.baseline.scores == alone["good"], (session.baseline.scores, alone["good"])
    assert session.results["release"].scores == alone["stub"], (session.results["release"].scores, alone["stub"])
    assert session.results["wrong"].scores == alone["wrong"], (session.results["wrong"].scores, alone["wrong"])
    assert session.control.scores == alone["good"] and not session.restore_errors


def test_feedback_preprocessor_removes_hidden_region_and_redacts_traceback():
    HideHiddenTests = grading.HideHiddenTests
    cell = nbformat.v4.new_code_cell(
        "assert f(1) == 1\n### BEGIN HIDDEN TESTS\nassert f(-1) == 1, 'negatives'\n### END HIDDEN TESTS",
        metadata={"nbgrader": {"grade": True, "grade_id": "t", "points": 1, "solution": False, "locked": True}},
    )
    cell.outputs = [nbformat.v4.new_output(
        "error", ename="AssertionError", evalue="negatives",
        traceback=["----> 3 assert f(-1) == 1, 'negatives'", "AssertionError: negatives"])]
    nb = nbformat.v4.new_notebook(cells=[cell])
    nb, _ = HideHiddenTests().preprocess(nb, {})
    text = nbformat.writes(nb)
    assert "f(-1)" not in text and "BEGIN HIDDEN" not in text
    assert "assert f(1) == 1" in nb.cells[0].source and "hidden tests: not shown" in nb.cells[0].source
    assert nb.cells[0].outputs[0].traceback == ["AssertionError: negatives"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_validate_exit_code_fails_on_stub_and_passes_on_solution(synthetic_course, tmp_path, no_leaked_processes):
    rel, src = _notebooks(synthetic_course)
    stub, solved, tampered = tmp_path / "stub.ipynb", tmp_path / "solved.ipynb", tmp_path / "tampered.ipynb"
    nbformat.write(rel, str(stub))
    nbformat.write(grading.fill_solutions(rel, src), str(solved))
    t = grading.fill_solutions(rel, src)
    t.cells[3].source = "pass  # the student deleted the test"
    nbformat.write(t, str(tampered))
    exe = [sys.executable, "-m", "lab_utils.cli", "validate", "--timeout", "30"]
    tmp = tmp_path / "tmp"  # everything the runs leave in their temp folder is a leak
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    procs = {p.stem: subprocess.Popen([*exe, str(p)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      cwd=tmp_path, env=env) for p in (stub, solved, tampered)}  # concurrently: kernels start slowly
    runs = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=400)
        runs[name] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    assert runs["stub"].returncode == 1, runs["stub"].stdout + runs["stub"].stderr
    assert "VALIDATION FAILED" in runs["stub"].stdout
    assert runs["solved"].returncode == 0, runs["solved"].stdout + runs["solved"].stderr
    assert "Success" in runs["solved"].stdout
    assert runs["tampered"].returncode == 1, "a changed locked test cell must not validate"
    left = sorted(p.name for p in tmp.iterdir() if p.name.startswith("dtlabs-"))
    assert not left, f"validating left the subjects' folders behind: {left}"


def test_validate_refuses_a_notebook_whose_folder_holds_the_venv(synthetic_course, tmp_path):
    """A notebook saved beside the venv (~/lab.ipynb with ~/.venv): its folder is what the subject may write and what
    the grader never imports from, so the venv would be both writable and cut off. Refused, and why, before a kernel
    starts. The venv is a real one in that folder, seeing this one's packages."""
    import site
    import sysconfig

    venv = tmp_path / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    inner = Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))
    (inner / "outer.pth").write_text(f"import site; site.addsitedir({site.getsitepackages()[0]!r})\n")
    rel, src = _notebooks(synthetic_course)
    solved = tmp_path / "solved.ipynb"
    nbformat.write(grading.fill_solutions(rel, src), str(solved))
    run = subprocess.run([str(venv / "bin" / "python"), "-m", "lab_utils.cli", "validate", str(solved)],
                         capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert run.returncode == 2, run.stdout + run.stderr
    assert f"the notebook's folder {tmp_path} holds the Python that grades it ({venv}" in run.stderr, run.stderr
    assert "Move the notebook into a folder of its own" in run.stderr


def test_validate_missing_notebook_is_an_error(tmp_path, capsys):
    assert cli.main(["validate", str(tmp_path / "nope.ipynb")]) == 2


def test_cli_lists_every_command(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--help"])
    assert exc.value.code == 0
    help_text = capsys.readouterr().out
    for command in ("doctor", "release", "validate", "grade", "bench"):
        assert command in help_text


def test_dtlabs_console_script_is_installed():
    exe = Path(sys.executable).with_name("dtlabs")
    if not exe.exists():
        pytest.skip("dtlabs console script not installed in this environment (pip install -e .)")
    out = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "validate" in out.stdout


def test_grade_with_nothing_submitted_says_so(tmp_path, capsys):
    rc = cli.main(["grade", "--course-root", str(tmp_path)])
    assert rc == 2 and "nothing to grade" in capsys.readouterr().out


def test_validate_wraps_long_failure_messages_instead_of_cutting_them():
    """nbgrader cuts error lines at 90 characters; the hint at the end of a tutor-style assertion must survive."""
    message = "AssertionError: " + "x" * 150 + " HINT-AT-THE-END: divide by the world size"
    text = _wrap_error("\x1b[31m" + message + "\x1b[0m\n  short line", "    ", 90)
    lines = text.split("\n")
    assert all(len(line) <= 90 for line in lines), lines
    assert "HINT-AT-THE-END: divide by the world size" in " ".join(line.strip() for line in lines)
    assert "\x1b" not in text and lines[-1] == "      short line"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_rerun_grades_only_new_or_changed_submissions(synthetic_course, tmp_path, no_leaked_processes, capsys):
    root = tmp_path / "course"
    shutil.copytree(synthetic_course, root)
    rel, src = _notebooks(root)
    grading.submit(root, "ann", LAB, grading.fill_solutions(rel, src))
    grading.submit(root, "bob", LAB, rel)
    base = ["grade", LAB, "--course-root", str(root), "--no-feedback", "--jobs", "2"]
    assert cli.main(base) == 0
    assert grading.cell_scores(root, LAB, "bob")["test_add"][0] == 0.0
    capsys.readouterr()

    assert cli.main(base) == 0
    assert "0 to grade (2 unchanged" in capsys.readouterr().out, "an unchanged class must not be graded again"

    grading.submit(root, "bob", LAB, grading.fill_solutions(rel, src))  # bob resubmits a correct notebook
    assert cli.main(base) == 0
    out = capsys.readouterr().out
    assert "1 to grade (1 unchanged" in out and "bob/" in out and "ann/" not in out, out
    assert grading.cell_scores(root, LAB, "bob") == {"test_add": (2.0, 2.0), "test_twice": (1.0, 1.0)}, (
        "a resubmission must replace the old grade, never keep it")

    assert cli.main([*base, "--force"]) == 0
    assert "2 to grade" in capsys.readouterr().out


def test_grade_records_a_lab_again_only_when_its_source_changed(synthetic_course, tmp_path):
    """`grade` skips nbgrader's generate_assignment (a process of its own) when the gradebook holds the lab as
    its source is now; a changed solution notebook (a new hidden test, other points) is recorded again."""
    root = tmp_path / "course"
    shutil.copytree(synthetic_course, root)
    assert grading.gradebook.holds_current(root, LAB), "release recorded the lab: grading need not record it again"
    nb_path = root / "solutions" / LAB / f"{LAB}.ipynb"
    nb_path.write_text(nb_path.read_text() + "\n")
    assert not grading.gradebook.holds_current(root, LAB), "a changed source must be recorded again before grading"
    (root / "grader" / "work" / "gradebook.db").unlink()
    grading.gradebook.note_recorded(root, [LAB])
    assert not grading.gradebook.holds_current(root, LAB), "a gradebook without the lab must get it recorded"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_grade_one_and_merge_for_job_arrays(synthetic_course, tmp_path, no_leaked_processes, capsys):
    root = tmp_path / "course"
    shutil.copytree(synthetic_course, root)
    rel, src = _notebooks(root)
    grading.submit(root, "carol", LAB, grading.fill_solutions(rel, src))
    results = tmp_path / "results"
    assert cli.main(["grade-one", LAB, "carol", "--out", str(results), "--course-root", str(root)]) == 0
    assert "carol/00_synthetic: 3/3" in capsys.readouterr().out
    assert grading.cell_scores(root, LAB, "carol") == {}, "grade-one must not write the course's gradebook"
    assert cli.main(["merge", str(results), "--course-root", str(root)]) == 0
    assert grading.cell_scores(root, LAB, "carol") == {"test_add": (2.0, 2.0), "test_twice": (1.0, 1.0)}
    assert (root / "grader" / "work" / "autograded" / "carol" / LAB / f"{LAB}.ipynb").is_file()


# Moves this submission's time in every gradebook under FOLDER to before the due date (a late penalty erased).
BACKDATE = textwrap.dedent("""
    import glob, sqlite3
    for _db in glob.glob(FOLDER + "/**/gradebook.db", recursive=True):
        _con = sqlite3.connect(_db)
        _con.execute("UPDATE submitted_assignment SET timestamp = '2030-01-01 00:00:00.000000'")
        _con.commit()
""")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_late_submission_that_backdates_itself_in_the_fallback_is_not_graded(synthetic_course, tmp_path,
                                                                              no_leaked_processes, capsys, monkeypatch):
    """Without bubblewrap a submission can write the scratch gradebook it runs beside: one that moves its own
    submission time before the due date (no late penalty) is NOT GRADED, with the reason, instead of graded on time."""
    import tempfile

    from helpers import REPO
    from helpers.synthetic import LATE_POLICY

    root = tmp_path / "course"
    shutil.copytree(synthetic_course, root)
    (root / "grader" / "nbgrader_config.py").write_text((REPO / "grader" / "nbgrader_config.py").read_text()
                                                        + LATE_POLICY)
    scratch = tmp_path / "tmp"  # the scratch courses and results of this run, and all the submission searches
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    monkeypatch.setenv("DTLABS_SANDBOX", "off")
    rel, src = _notebooks(root)
    folder = grading.submit(root, "mallory", LAB, grading.fill_solutions(
        rel, src, {"add": "def add(a, b):\n    return a + b\n\n\ndef twice(x):\n    return 2 * x\n\n\nFOLDER = " + repr(str(scratch)) + "\n" + BACKDATE})).parent
    (folder / "timestamp.txt").write_text("2030-01-12 09:00:00 UTC")  # two days late: two points
    code = cli.main(["grade-one", LAB, "mallory", "--out", str(scratch / "results"), "--course-root", str(root)])
    out = capsys.readouterr().out
    assert code == 1, out
    assert "mallory/00_synthetic: NOT GRADED" in out and "it changed the gradebook it was graded in: its " \
        "submission time (2030-01-01 00:00:00, collected as 2030-01-12 09:00:00)" in out, out


def test_starting_the_sandbox_is_not_cut_short_by_the_per_cell_limit(tmp_path, monkeypatch):
    """The hidden first cell starts the subject (bubblewrap, Python, torch): under load that takes longer than an
    instructor's short ``--timeout`` for student cells, which must not cost a good submission its grade."""
    from lab_utils.grading.split.execute import SplitExecute
    from lab_utils.grading.split.proxy import START_TIMEOUT_S

    monkeypatch.chdir(tmp_path)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")])
    ex = SplitExecute(timeout=5)
    with ex.split(nb, {}):
        preamble, answer = nb.cells
        assert "start_grading" in preamble.source
        assert ex.timeout_func(preamble) == START_TIMEOUT_S
        assert ex.timeout_func(answer) == 5, "a student's cell keeps the instructor's limit"
    assert nb.cells == [answer] and ex.timeout_func is None


FORGED_ROW = "mallory,\n00_synthetic,,,victim,,,,10.0,0.0,10.0,3.0"  # forged a grades.csv row with nbgrader's exporter
ESCAPES = "eve\x1b[1A\x1b[2K\r   eve: 10 of 10"  # drew a fake grade over the NOT GRADED line above it
FORMULA = '=HYPERLINK("evil.example","10")'


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_grade_refuses_bad_ids_at_the_door_and_grades_the_rest(synthetic_course, tmp_path, no_leaked_processes,
                                                                capsys):
    """The id attacks through `dtlabs grade --submissions`: forged, formula, escape-code and case-pair ids and a
    symlinked folder are NOT GRADED with the reason, shown escaped, never in the gradebook or grades.csv; the
    submission time is the instructor's (--timestamps), not the student's own timestamp.txt; an unreadable notebook
    in a course with a due date gets its true reason, not a tampering verdict; a student of the gradebook without a
    submission is MISSING; the rest is graded and grades.csv is quoted."""
    from helpers import REPO
    from helpers.synthetic import LATE_POLICY

    root = tmp_path / "course"
    shutil.copytree(synthetic_course, root)
    (root / "grader" / "nbgrader_config.py").write_text((REPO / "grader" / "nbgrader_config.py").read_text()
                                                        + LATE_POLICY)  # due 2030-01-10 12:00, a point a day late
    grading.register_students(root, ["ghost"])  # on the class list, submitted nothing
    rel, src = _notebooks(root)
    good = grading.fill_solutions(rel, src)
    inbox = tmp_path / "inbox"
    for student in ("ann", FORGED_ROW, FORMULA, ESCAPES, "Bob", "bob"):
        _write(inbox, student, good)
    (inbox / "ann" / LAB / "timestamp.txt").write_text("2030-01-01 00:00:00 UTC")  # "I was early"
    (inbox / "dan" / LAB).mkdir(parents=True)
    (inbox / "dan" / LAB / f"{LAB}.ipynb").write_text("{ this is not a notebook")
    (inbox / "linked").symlink_to(inbox / "ann")
    times = tmp_path / "times.csv"
    times.write_text("student,timestamp\nann,2030-01-11 13:00:00 UTC\ndan,2030-01-09 13:00:00 UTC\n")  # ann: 25 h late
    csv_path = tmp_path / "grades.csv"

    rc = cli.main(["grade", "--submissions", str(inbox), "--timestamps", str(times), "--csv", str(csv_path),
                   "--no-feedback", "--course-root", str(root)])
    out = capsys.readouterr().out
    assert rc == 1, out
    assert "\x1b" not in out and "\n00_synthetic,,,victim" not in out, "an id reached the terminal raw"
    for shown, why in ((repr(FORGED_ROW), "control"), (repr(FORMULA), "begins with '='"), (repr(ESCAPES), "control"),
                       ("Bob", "differs only in case from 'bob'"), ("bob", "differs only in case from 'Bob'"),
                       ("linked", "symbolic link")):
        line = next((x for x in out.splitlines() if x.strip().startswith(f"NOT GRADED: {shown} (")), None)
        assert line and why in line, f"{shown}: {line}\n{out}"
    dan = next(x for x in out.splitlines() if "NOT GRADED: dan/" in x)
    assert "invalid notebook" in dan and "changed the gradebook" not in dan, dan
    assert f"MISSING: no submission of {LAB} from ghost" in out, out

    from nbgrader.api import Gradebook

    with Gradebook(grading.gradebook.db_url(root)) as gb:
        assert sorted(s.id for s in gb.students) == ["ann", "dan", "ghost"], "a refused id was registered"
    assert sorted(p.name for p in (root / "grader" / "work" / "submitted").iterdir()) == ["ann", "dan"]
    text = csv_path.read_text()
    assert all(line.startswith('"') for line in text.splitlines()), text
    rows = {r["student_id"]: r for r in grading.read_grades_csv(csv_path)}
    assert set(rows) == {"ann", "dan", "ghost"}, rows
    ann = rows["ann"]
    assert (float(ann["raw_score"]), float(ann["late_submission_penalty"]), float(ann["score"])) == (3.0, 2.0, 1.0), (
        "ann's time is the instructor's (25 h late: 2 points), not her own timestamp.txt", ann)


SLEEPS = {"add": "import time\ntime.sleep(600)\n\n\ndef add(a, b):\n    return a + b\n\n\n"
                 "def twice(x):\n    return 2 * x"}
LIMIT_S = 25  # the synthetic lab grades in seconds; a sleeping cell is stopped here long before its 180 s cell limit


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_grade_stops_a_submission_at_the_course_submission_timeout(synthetic_course, tmp_path, no_leaked_processes,
                                                                   capsys):
    """`c.DTLabs.submission_timeout` in the course config takes effect in `dtlabs grade`, not the built-in 1800 s."""
    root = tmp_path / "course"
    shutil.copytree(synthetic_course, root)
    from helpers import REPO

    (root / "grader" / "nbgrader_config.py").write_text((REPO / "grader" / "nbgrader_config.py").read_text()
                                                        + f"\nc.DTLabs.submission_timeout = {LIMIT_S}\n")
    rel, src = _notebooks(root)
    grading.submit(root, "sleepy", LAB, grading.fill_solutions(rel, src, SLEEPS))
    cli.main(["grade", LAB, "--no-feedback", "--course-root", str(root)])
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "sleepy/" in x)
    assert f"wall-clock limit: grading took over {LIMIT_S} s" in line and "3/3" not in line, out


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_grade_one_stops_a_submission_at_the_submission_timeout_of_the_environment(synthetic_course, tmp_path,
                                                                                  no_leaked_processes, capsys,
                                                                                  monkeypatch):
    """`DTLABS_SUBMISSION_TIMEOUT` takes effect in `dtlabs grade-one` (a Slurm array task), and the run it killed
    leaves nothing in the temp folder (its kernel's and subject's folders go with the run's own temp folder)."""
    root = tmp_path / "course"
    shutil.copytree(synthetic_course, root)
    rel, src = _notebooks(root)
    grading.submit(root, "sleepy", LAB, grading.fill_solutions(rel, src, SLEEPS))
    monkeypatch.setenv("DTLABS_SUBMISSION_TIMEOUT", str(LIMIT_S))
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    cli.main(["grade-one", LAB, "sleepy", "--out", str(tmp_path / "results"), "--course-root", str(root)])
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith(f"sleepy/{LAB}: "))
    assert f"wall-clock limit: grading took over {LIMIT_S} s" in line and "3/3" not in line, out
    assert not [p.name for p in tmp.iterdir() if p.name.startswith("dtlabs-")], sorted(p.name for p in tmp.iterdir())


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_validate_stops_a_notebook_at_the_submission_timeout(synthetic_course, tmp_path, no_leaked_processes):
    """`DTLABS_SUBMISSION_TIMEOUT` takes effect in `dtlabs validate` too: a student learns before submitting that
    grading would stop the notebook, instead of waiting out the cell limit."""
    rel, src = _notebooks(synthetic_course)
    sleepy = tmp_path / "sleepy.ipynb"
    nbformat.write(grading.fill_solutions(rel, src, SLEEPS), str(sleepy))
    run = subprocess.run([sys.executable, "-m", "lab_utils.cli", "validate", str(sleepy)], capture_output=True,
                         text=True, cwd=tmp_path, timeout=170,
                         env={**os.environ, "DTLABS_SUBMISSION_TIMEOUT": str(LIMIT_S)})
    assert run.returncode == 1, run.stdout + run.stderr
    assert f"stopped after {LIMIT_S} s: grading stops a submission that runs longer" in run.stderr, run.stderr
