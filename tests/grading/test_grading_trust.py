"""Grades a class can trust, on the synthetic course (seconds per notebook):

- the canary: a machine that cannot grade a lab refuses, says why and writes nothing; its verdict is kept; a sandbox
  that fails for a reason that is not the student's is never a zero, and stops the class until the canary passes;
- no grading entry point (dtlabs grade, grade-one, validate, a swap session) imports from, or works in, a folder a
  student writes, and a submission's links, special files and shipped modules are data, never followed or run;
- once hidden tests have run, an error the student's code raised keeps its type but carries the grader's words
  (``split.crossing``, on replies as they come back), and a subject stopped by the memory limit is named so.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import nbformat
import pytest
from helpers.synthetic import SYNTHETIC_LAB as LAB

from lab_utils import cli, grading
from lab_utils.grading import batch, canary
from lab_utils.grading.quality.swaps import check_swaps, release_swap
from lab_utils.grading.submission import Result
from lab_utils.status import Status

# A test cell that runs in the grader's kernel only: it fails when the kernel works in, or imports from, a folder
# the submission can write.
PATH_TEST = (
    "assert add(1, 1) == 2  # a point earned by an answer (the canary refuses a course that gives one for nothing)\n"
    "import os, sys\n"
    "assert '' not in sys.path and '.' not in sys.path, f\"the grader's path holds its working directory: {sys.path}\"\n"
    "assert os.listdir(os.getcwd()) == [], f'the grader works in a folder with files in it: {os.listdir(os.getcwd())}'"
)


def _trap(marker: Path) -> str:
    return f"open({str(marker)!r}, 'w').write(__file__)\nraise ImportError('a shipped module was imported')\n"


@pytest.fixture
def course(synthetic_course, tmp_path):
    """The synthetic course, plus a test cell (1 point) that checks the grader's own path and folder."""
    root = tmp_path / "course"
    shutil.copytree(synthetic_course, root)
    path = root / "solutions" / LAB / f"{LAB}.ipynb"
    nb = nbformat.read(str(path), as_version=4)
    nb.cells.insert(-1, nbformat.v4.new_code_cell(PATH_TEST, id="test-grader-path", metadata={"nbgrader": {
        "schema_version": 3, "grade_id": "test_grader_path", "grade": True, "solution": False, "locked": True,
        "points": 1}}))
    nbformat.write(nb, str(path))
    grading.release([LAB], root=root)
    return root


def _notebooks(root):
    rel = nbformat.read(str(root / "labs" / LAB / f"{LAB}.ipynb"), as_version=4)
    src = nbformat.read(str(root / "solutions" / LAB / f"{LAB}.ipynb"), as_version=4)
    return rel, src


def _submit(folder: Path, student: str, nb, marker: Path | None = None) -> Path:
    """A submission; with ``marker``, it ships traps beside the notebook: a lab_utils/ package and a nbformat.py
    that leave ``marker`` if any process imports them, and a helper module the answer may use."""
    dest = folder / student / LAB
    dest.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(dest / f"{LAB}.ipynb"))
    if marker is not None:
        (dest / "lab_utils").mkdir()
        (dest / "lab_utils" / "__init__.py").write_text(_trap(marker))
        (dest / "nbformat.py").write_text(_trap(marker))
        (dest / "utils.py").write_text("HELPER = 1\n")
    return dest


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_no_grading_entry_point_imports_from_or_works_in_the_submissions_folder(course, tmp_path, no_leaked_processes,
                                                                                capsys):
    rel, src = _notebooks(course)
    marker = tmp_path / "imported-a-shipped-module"
    good = grading.fill_solutions(rel, src)
    good.cells[2].source += "\n\nimport utils\nassert utils.HELPER == 1  # the student's own helper module"
    inbox = tmp_path / "inbox"
    folder = _submit(inbox, "good", good, marker)
    full = {"test_add": (2.0, 2.0), "test_twice": (1.0, 1.0), "test_grader_path": (1.0, 1.0)}

    assert grading.grade([LAB], course_root=course, submissions_dir=inbox, feedback=False, progress=False) is Status.DONE
    assert grading.cell_scores(course, LAB, "good") == full, capsys.readouterr().out

    out = tmp_path / "results"  # grade-one, as a Slurm array task runs it
    assert cli.main(["grade-one", LAB, "good", "--out", str(out), "--course-root", str(course)]) == 0
    import json

    result = json.loads((out / LAB / "good" / "result.json").read_text())  # RESULTS/<lab>/<student>/
    assert result["graded"] and result["points"] == [4.0, 4.0], result

    assert grading.validate(folder / f"{LAB}.ipynb") is Status.DONE  # the student's own check, beside their traps

    report = check_swaps(LAB, [release_swap(LAB, course)], root=course)  # a swap session
    assert report.baseline.scores.get("test_grader_path") == (1.0, 1.0), report.baseline
    assert not marker.exists(), f"a module the submission shipped was imported: {marker.read_text()}"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_links_and_special_files_in_a_submission_are_left_out_and_named(course, tmp_path, no_leaked_processes):
    rel, src = _notebooks(course)
    inbox = tmp_path / "inbox"
    _submit(inbox, "victim", grading.fill_solutions(rel, src))
    # the answer reads the solution through a link beside it and runs its answers
    reader = grading.fill_solutions(rel, src, {"add": (
        "import json\n"
        "def add(a, b):\n    return 0\n\n\ndef twice(x):\n    return 0\n\n\n"
        "for name in ('solution.ipynb', 'victim.ipynb'):\n"
        "    try:\n"
        "        for c in json.load(open(name))['cells']:\n"
        "            if '### BEGIN SOLUTION' in ''.join(c['source']):\n"
        "                exec(''.join(c['source']))\n"
        "    except OSError:\n"
        "        pass\n")})
    folder = _submit(inbox, "reader", reader)
    (folder / "solution.ipynb").symlink_to(course / "solutions" / LAB / f"{LAB}.ipynb")
    (folder / "victim.ipynb").symlink_to(Path("..", "..", "victim", LAB, f"{LAB}.ipynb"))
    (folder / "up").symlink_to(Path("..", "..", "..", ".."))  # the folder above everything: a copy would recurse
    os.mkfifo(folder / "pipe")  # a special file: opening it would block the copy
    lines = []
    code = grading.grade([LAB], course_root=course, submissions_dir=inbox, feedback=True, progress=False,
                         out=lines.append)
    text = "\n".join(lines)
    assert code is Status.DONE, text
    assert grading.cell_scores(course, LAB, "reader")["test_add"][0] == 0, text
    assert "solution.ipynb (a symbolic link)" in text and "pipe (not a regular file)" in text, text
    autograded = course / "grader" / "work" / "autograded"
    assert sorted(p.name for p in (autograded / "reader" / LAB).iterdir()) == [f"{LAB}.ipynb"]
    feedback = course / "grader" / "work" / "feedback" / "reader" / LAB
    assert sorted(p.name for p in feedback.iterdir()) == [f"{LAB}.html"]


# ------------------------------------------------------------------------------------------------ the canary
def _class(course, tmp_path, students=("good", "wrong")):
    rel, src = _notebooks(course)
    inbox = tmp_path / "inbox"
    for s in students:
        nb = grading.fill_solutions(rel, src) if s != "wrong" else grading.fill_solutions(
            rel, src, {"add": "def add(a, b):\n    return abs(a) + abs(b)\n\n\ndef twice(x):\n    return 2 * x"})
        _submit(inbox, s, nb)
    return inbox


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_machine_that_cannot_grade_refuses_says_why_and_writes_nothing(course, tmp_path, monkeypatch,
                                                                          no_leaked_processes):
    inbox = _class(course, tmp_path)
    monkeypatch.setenv("DTLABS_MEMORY_MB", "5")  # no Python starts in 5 MB: the solution cannot get its marks
    lines = []
    code = grading.grade([LAB], course_root=course, submissions_dir=inbox, progress=False, out=lines.append)
    text = "\n".join(lines)
    assert code is Status.REFUSED, text
    assert "REFUSED" in text and "memory limit" in text and "c.DTLabs.memory_mb" in text, text
    work = course / "grader" / "work"
    assert grading.cell_scores(course, LAB, "good") == {} and not (work / "grades.csv").exists(), text
    assert not (work / "autograded").exists(), text


def test_a_subject_stopped_by_the_address_space_limit_before_the_watchdog_looks_is_named_a_memory_limit(tmp_path):
    """The race the canary test leaves to chance: the watchdog (here slowed to a minute) has not yet measured the
    subject when its small limit stops the interpreter, so the reason comes from what the subject printed."""
    from lab_utils.grading.boundary.watchdog import Limits
    from lab_utils.grading.split import channel

    work = tmp_path / "work"
    work.mkdir()
    session = channel.SubjectProcess(work, limits=Limits(memory_mb=5, poll_s=60.0))
    try:
        with pytest.raises(channel.SubjectGone, match="memory limit") as caught:
            session.wait_ready(timeout=60)
    finally:
        session.stop()
    assert "exited with code" not in str(caught.value), caught.value


@pytest.mark.parametrize("mode", ["bwrap", "off"])
def test_a_process_flood_the_watchdog_has_not_yet_seen_is_named_when_the_submission_ends(tmp_path, mode, monkeypatch,
                                                                                       no_leaked_processes):
    """The race a loaded machine loses: a cell starts a flood of processes and the grading ends before the watchdog
    (here slowed to a minute) looks. The last look when the subject stops names the limit all the same."""
    from lab_utils.grading.boundary import sandbox
    from lab_utils.grading.boundary.watchdog import Limits
    from lab_utils.grading.split import channel

    if mode == "bwrap" and sandbox.mode() != "bwrap":
        pytest.skip("bubblewrap cannot build a sandbox here")
    monkeypatch.setenv("DTLABS_SANDBOX", mode)
    work, report = tmp_path / "work", tmp_path / "sandbox.txt"
    work.mkdir()
    session = channel.SubjectProcess(work, limits=Limits(max_procs=20, poll_s=60.0), report_path=str(report))
    try:
        session.wait_ready(timeout=60)
        reply = session.request({"op": "run_cell", "source": "import subprocess\n"
                                 "_flood = [subprocess.Popen(['sleep', '300']) for _ in range(40)]"})
        assert reply.get("ok"), reply
    finally:
        session.stop()
    assert "process limit" in (report.read_text() if report.exists() else ""), "the flood was not named"
    assert "process limit" in (session.box.reason or "")  # and no_leaked_processes: every sleep is gone


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_canary_verdict_is_kept_until_something_it_depends_on_changes(course, tmp_path, monkeypatch):
    monkeypatch.setenv("DTLABS_CACHE_DIR", str(tmp_path / "cache"))
    first = canary.check(course, LAB, out=lambda *_: None)
    assert first.ok and not first.cached and first.solution == (4.0, 4.0) and first.release[0] == 0, first
    again = canary.check(course, LAB, out=lambda *_: None)
    assert again.ok and again.cached
    monkeypatch.setenv("DTLABS_MAX_PROCS", "50")  # a limit it was graded under changed
    assert not canary.check(course, LAB, out=lambda *_: None).cached


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_sandbox_that_fails_is_never_a_zero_and_stops_the_class_until_the_canary_passes(course, tmp_path,
                                                                                         monkeypatch):
    inbox = _class(course, tmp_path, ("a_unlucky", "b_good", "c_wrong"))
    real = batch.grade_submission
    failed = []

    def flaky(course_root, lab, student, template, **kw):
        """The first grading of a_unlucky meets a sandbox that does not start (the machine's fault)."""
        if student == "a_unlucky" and not failed:
            failed.append(student)
            res = Result(lab, student, Path(template))
            res.reasons = ["sandbox: environment: the sandbox did not start (bwrap: setting up uid map: Permission "
                           "denied)"]
            return res
        return real(course_root, lab, student, template, **kw)

    checks = []
    real_check = canary.check

    def counting_check(*a, **kw):
        checks.append(kw.get("force", False))
        return real_check(*a, **kw)

    monkeypatch.setattr(batch, "grade_submission", flaky)
    monkeypatch.setattr(canary, "check", counting_check)
    lines = []
    code = grading.grade([LAB], course_root=course, submissions_dir=inbox, feedback=False, progress=False,
                         out=lines.append)
    text = "\n".join(lines)
    assert code is Status.DONE, text
    assert "NOT YET GRADED: a_unlucky" in text and True in checks, text  # the canary ran again, forced
    scores = {s: sum(p for p, _ in grading.cell_scores(course, LAB, s).values()) for s in ("a_unlucky", "b_good")}
    assert scores == {"a_unlucky": 4.0, "b_good": 4.0}, text  # graded on the retry, never recorded as a zero

    # the machine is broken by then: the rest of the class is NOT GRADED (environment), exit 2, nothing recorded
    failed.clear()
    monkeypatch.setattr(canary, "check", lambda *a, **kw: canary.Verdict(
        LAB, problems=["the solution lost points (test)"] if kw.get("force") else []))
    lines = []
    code = grading.grade([LAB], course_root=course, submissions_dir=inbox, feedback=False, progress=False,
                         out=lines.append, force=True)
    text = "\n".join(lines)
    assert code is Status.REFUSED and "STOPPED" in text, text
    assert "NOT GRADED: b_good/00_synthetic (environment:" in text, text
    assert "NOT GRADED: c_wrong/00_synthetic (environment:" in text, text


# ---------------------------------------------------------------------------------------------- crossing, on replies
def test_an_error_keeps_its_built_in_type_and_loses_its_words_once_hidden_tests_have_run():
    from lab_utils.grading.split.crossing import StudentError, remote_exception

    reply = {"ok": False, "ename": "ValueError", "evalue": "secret=42", "traceback": ["line with secret=42"]}
    shown = remote_exception(reply, hidden=False)
    assert type(shown) is ValueError and str(shown) == "secret=42"
    assert shown._render_traceback_() == ["line with secret=42"]
    kept = remote_exception(reply, hidden=True)
    assert type(kept) is ValueError and "secret" not in str(kept) and not hasattr(kept, "_render_traceback_")
    own = remote_exception({"ename": "SecretNameError", "evalue": "secret=42"}, hidden=True)
    assert type(own) is StudentError and "Secret" not in str(own) and "secret" not in str(own)
    assert str(remote_exception({"ename": "SystemExit", "evalue": "3"}, hidden=False)) == "SystemExit: 3"


def test_a_rank_failure_keeps_its_type_and_rank_and_loses_its_words_once_hidden_tests_have_run():
    from lab_utils.grading.split.crossing import remote_exception
    from lab_utils.launcher.diagnostics import RankFailedError, RankTimeoutError

    failed = {"ename": "RankFailedError", "evalue": "rank 1 said secret=42", "launch": {"rank": 1}}
    assert str(remote_exception(failed, hidden=False)) == "rank 1 said secret=42"
    exc = remote_exception(failed, hidden=True)
    assert isinstance(exc, RankFailedError) and "rank 1 of the submission failed" in str(exc) and "secret" not in str(exc)
    stuck = remote_exception({"ename": "RankTimeoutError", "evalue": "secret", "launch": {"stuck_ranks": [0, "x"]}},
                             hidden=True)
    assert isinstance(stuck, RankTimeoutError) and "secret" not in str(stuck)


def test_a_dead_subject_s_last_words_name_the_memory_limit_only_when_they_say_so():
    from lab_utils.grading.split.crossing import memory_reason

    assert memory_reason(b"Traceback ...\nMemoryError\n", 512).startswith(
        "memory limit: a process of the submission could not allocate memory under the sandbox's limit (512 MB)")
    assert "noexec" in memory_reason(b"libtorch.so: failed to map segment from shared object", 512)
    assert memory_reason(b"Segmentation fault", 512) is None
