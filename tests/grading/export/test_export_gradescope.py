"""The Gradescope autograder bundle (`dtlabs export gradescope`), run as Gradescope runs it: the zip unpacked into
ROOT/source, a notebook in ROOT/submission, `bash ROOT/source/run_autograder` with the course venv on PATH
(DTLABS_AUTOGRADER_ROOT=ROOT), then ROOT/results/results.json read back.

What they protect: the zip has what Gradescope's specification and grading need; a submission is graded as `dtlabs
grade` grades it (the solution full marks, the release zero, a known-wrong answer and a cheat lose what they lose
there); no hidden test source reaches results.json or run_autograder's output; a submission that is not one
readable notebook scores 0 with the reason; a machine that cannot grade says so and exits non-zero.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import nbformat
import pytest
from helpers import REPO
from helpers.synthetic import HIDDEN_SOURCE, SYNTHETIC_LAB as LAB, make_synthetic_course
from helpers.known_wrong import known_wrong, read_known_wrong

from lab_utils import grading
from lab_utils.grading.export import gradescope

VENV_BIN = str(Path(sys.executable).parent)
pytestmark = pytest.mark.xdist_group("gradescope")  # one worker builds the wheel once and grades the bundles


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """This package's wheel, built once for every bundle of this module (building it takes seconds)."""
    return gradescope.build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def synthetic_bundle(synthetic_course, tmp_path_factory, wheel):
    """The synthetic course (read only) and its bundle."""
    return synthetic_course, gradescope.build(LAB, tmp_path_factory.mktemp("gs-out"), course_root=synthetic_course,
                                              wheel=wheel, out=lambda *_: None)


def unpack(zip_path: Path, root: Path) -> Path:
    (root / "source").mkdir(parents=True)
    (root / "submission").mkdir()
    with zipfile.ZipFile(zip_path) as zf:
        zf.extractall(root / "source")
    return root


def start(root: Path, *, env=None, path=VENV_BIN) -> subprocess.Popen:
    environ = {**os.environ, "DTLABS_AUTOGRADER_ROOT": str(root), "PATH": f"{path}:{os.environ['PATH']}", **(env or {})}
    return subprocess.Popen(["bash", str(root / "source" / "run_autograder")], env=environ, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen, root: Path, timeout=900) -> tuple[int, str, dict, str]:
    """(exit status, run_autograder's output, results.json, its raw text)."""
    out, _ = proc.communicate(timeout=timeout)
    text = (root / "results" / "results.json").read_text()
    return proc.returncode, out, json.loads(text), text


def graded(results: dict) -> dict:
    return {t["name"].rsplit("(", 1)[-1].rstrip(")") if "(" in t["name"] else t["name"]: t for t in results["tests"]}


def assert_no_hidden_source(*texts: str) -> None:
    for text in texts:
        assert HIDDEN_SOURCE not in text and "BEGIN HIDDEN" not in text, f"hidden test source leaked:\n{text[:3000]}"


def _notebooks(root: Path):
    rel = nbformat.read(str(root / "labs" / LAB / f"{LAB}.ipynb"), as_version=4)
    src = nbformat.read(str(root / "solutions" / LAB / f"{LAB}.ipynb"), as_version=4)
    return rel, src


@pytest.mark.slow
def test_the_zip_holds_what_gradescope_and_grading_need(synthetic_bundle):
    root, zip_path = synthetic_bundle
    with zipfile.ZipFile(zip_path) as zf:
        names = set(zf.namelist())
        modes = {i.filename: (i.external_attr >> 16) & 0o777 for i in zf.infolist()}
        manifest = json.loads(zf.read("dtlabs-autograder.json"))
        source = zf.read(f"course/solutions/{LAB}/{LAB}.ipynb").decode()
        wheel_name = next(n for n in names if n.startswith("dist/") and n.endswith(".whl"))
        constraints = zf.read("constraints.txt").decode()
        with zf.open(wheel_name) as fh, zipfile.ZipFile(fh) as wheel_zip:
            in_wheel = set(wheel_zip.namelist())
    assert {"setup.sh", "run_autograder"} <= names, "Gradescope finds both scripts at the zip's root"
    assert modes["setup.sh"] & 0o111 and modes["run_autograder"] & 0o111, modes
    assert HIDDEN_SOURCE in source, "the bundle must carry the hidden tests, or it grades less than dtlabs grade"
    assert manifest["lab"] == LAB
    assert [(t["grade_id"], t["points"], t["hidden"], t["visibility"]) for t in manifest["tests"]] == [
        ("test_add", 2.0, True, "after_published"), ("test_twice", 1.0, False, "visible")]
    import torch

    assert f"torch=={torch.__version__.split('+')[0]}\n" in constraints and "nbgrader==" in constraints
    package = {str(p.relative_to(grading.REPO_ROOT)) for p in (grading.REPO_ROOT / "lab_utils").rglob("*")
               if p.is_file() and "__pycache__" not in p.parts}
    assert not package - in_wheel, f"the wheel lacks {sorted(package - in_wheel)[:5]}"


@pytest.mark.slow
def test_visibility_of_hidden_tests_comes_from_the_course_config(tmp_path, wheel):
    root = make_synthetic_course(tmp_path / "course")
    (root / "grader" / "nbgrader_config.py").write_text(
        (REPO / "grader" / "nbgrader_config.py").read_text()
        + f"\nc.DTLabs.gradescope_visibility = {{{LAB!r}: 'after_due_date'}}\n")
    zip_path = gradescope.build(LAB, tmp_path / "out", course_root=root, wheel=wheel, out=lambda *_: None)
    with zipfile.ZipFile(zip_path) as zf:
        manifest = json.loads(zf.read("dtlabs-autograder.json"))
        assert "course/grader/nbgrader_config.py" in zf.namelist(), "the course config travels with the lab"
    assert {t["grade_id"]: t["visibility"] for t in manifest["tests"]} == {"test_add": "after_due_date",
                                                                          "test_twice": "visible"}


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_bundle_grades_as_dtlabs_grade_does(synthetic_bundle, tmp_path, no_leaked_processes):
    course, zip_path = synthetic_bundle
    rel, src = _notebooks(course)
    wrong = known_wrong(LAB, course)[0]  # ignores_sign: fails only test_add's hidden check
    cheat = (REPO / "grader" / "cheats" / "builtins_patch.py").read_text()  # assertions can no longer fail
    submissions = {"solution": grading.fill_solutions(rel, src), "release": rel,
                   "wrong": grading.fill_solutions(rel, src, {wrong.replaces: wrong.source}),
                   "cheat": grading.fill_solutions(rel, src, {wrong.replaces: wrong.source + "\n\n\n" + cheat})}
    roots = {}
    for name, nb in submissions.items():
        roots[name] = unpack(zip_path, tmp_path / name)
        nbformat.write(nb, str(roots[name] / "submission" / "my answers.ipynb"))  # any name: the one notebook counts
    # the solution first: its run grades the canary (or finds the verdict kept); then the others at once
    runs = {"solution": finish(start(roots["solution"]), roots["solution"])}
    procs = {name: start(roots[name]) for name in ("release", "wrong", "cheat")}
    runs.update({name: finish(proc, roots[name]) for name, proc in procs.items()})

    for name, (code, out, results, text) in runs.items():
        assert code == 0, f"{name}: run_autograder exited {code}:\n{out}"
        assert_no_hidden_source(text, out)
        assert {"score", "execution_time", "output", "tests"} <= set(results), results
        assert results["stdout_visibility"] == "hidden"
        assert [t["max_score"] for t in results["tests"]] == [2.0, 1.0]
        for t in results["tests"]:
            assert t["status"] == ("passed" if t["score"] == t["max_score"] else "failed"), t
            assert t["visibility"] == ("after_published" if "test_add" in t["name"] else "visible"), t
    scores = {name: {gid: t["score"] for gid, t in graded(r[2]).items()} for name, r in runs.items()}
    assert scores["solution"] == {"test_add": 2.0, "test_twice": 1.0}, runs["solution"][1]
    assert runs["solution"][2]["score"] == 3.0 and "canary: solution 3/3, release 0/3" in runs["solution"][1]
    assert scores["release"] == {"test_add": 0.0, "test_twice": 0.0}, runs["release"][1]
    assert runs["release"][2]["score"] == 0.0
    # dtlabs grade gives ignores_sign 1/3 (tests/grading/test_grading_cli.py): the hidden check alone catches it
    assert scores["wrong"] == {"test_add": 0.0, "test_twice": 1.0}, runs["wrong"][1]
    failed = graded(runs["wrong"][2])["test_add"]["output"]
    assert failed == "AssertionError: add is wrong for negative or fractional numbers", failed
    # the cheat gains nothing over the honest wrong answer underneath it
    assert scores["cheat"] == scores["wrong"], runs["cheat"][1]
    assert graded(runs["cheat"][2])["test_add"]["output"] == failed


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_score_forged_in_the_scratch_gradebook_never_reaches_gradescope(synthetic_bundle, tmp_path,
                                                                          no_leaked_processes):
    """Without bubblewrap (DTLABS_SANDBOX=off, as in a container that allows no namespaces) a submission can write the
    scratch course's gradebook it is graded in, as grader/cheats/gradebook_write.py does: the manual scores it forged
    there never reach results.json, and the submission is not graded, with the reason."""
    course, zip_path = synthetic_bundle
    rel, src = _notebooks(course)
    wrong = known_wrong(LAB, course)[0]  # ignores_sign: 0/2 on test_add, 1/1 on test_twice
    scratch_tmp = tmp_path / "tmp"  # where this run's scratch courses are made, and all the forger searches
    scratch_tmp.mkdir()
    forge = textwrap.dedent(f"""
        import glob, sqlite3
        for _db in glob.glob({str(scratch_tmp)!r} + "/**/gradebook.db", recursive=True):
            _con = sqlite3.connect(_db)
            _con.execute("UPDATE grade SET manual_score = 100")
            _con.commit()
            print("forged", _db)
        """)
    root = unpack(zip_path, tmp_path / "forger")
    nbformat.write(grading.fill_solutions(rel, src, {wrong.replaces: wrong.source + "\n\n\n" + forge}),
                   str(root / "submission" / f"{LAB}.ipynb"))
    code, out, results, text = finish(start(root, env={"DTLABS_SANDBOX": "off", "TMPDIR": str(scratch_tmp)}), root)
    assert code == 0, out
    assert results["score"] == 0.0 and all(t["score"] == 0.0 for t in results["tests"]), (results, out[-3000:])
    assert results["output"].startswith("NOT GRADED: ") and "changed the gradebook it was graded in: scores " \
        "autograde never writes (manual, extra credit) on test_add, test_twice" in results["output"], results


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_what_student_code_says_under_a_hidden_call_never_reaches_results(synthetic_bundle, tmp_path,
                                                                         no_leaked_processes):
    """For a cell with hidden tests results.json carries what the grader composed: grader/cheats/
    hidden_args_in_exception.py prints and raises each call's arguments base64-encoded, and neither its message nor
    the hidden arguments (add(-1, 1), add(0.5, 0.25)) appear; grader/cheats/huge_frame.py declares a frame of
    1500000000 bytes, and that number (62 bits of its choosing) is in no output: the refusal names the limit."""
    import base64

    course, zip_path = synthetic_bundle
    rel, src = _notebooks(course)
    wrong = known_wrong(LAB, course)[0]
    runs = {}
    for name in ("hidden_args_in_exception", "huge_frame"):
        cheat = (REPO / "grader" / "cheats" / f"{name}.py").read_text()
        root = unpack(zip_path, tmp_path / name)
        nbformat.write(grading.fill_solutions(rel, src, {wrong.replaces: wrong.source + "\n\n\n" + cheat}),
                       str(root / "submission" / f"{LAB}.ipynb"))
        runs[name] = finish(start(root), root)
    code, out, results, text = runs["hidden_args_in_exception"]
    assert code == 0, out
    secrets = ["DTLEAK"] + [base64.b64encode(repr((args, {})).encode()).decode() for args in [(-1, 1), (0.5, 0.25)]]
    for secret in secrets:
        assert secret not in text, f"student text from a hidden call reached results.json: {text[:3000]}"
    assert graded(results)["test_add"]["score"] == 0.0, results
    assert "hidden test" in graded(results)["test_add"]["output"], results  # the grader's own words
    code, out, results, text = runs["huge_frame"]
    assert "1500000000" not in text and "1500000000" not in out, f"the declared size was echoed:\n{text}\n{out[-2000:]}"
    assert "over the limit of" in results["output"] or "over the limit of" in out, (results, out[-2000:])


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_submission_that_is_not_one_readable_notebook_scores_zero_with_the_reason(synthetic_bundle, tmp_path,
                                                                                     no_leaked_processes):
    course, zip_path = synthetic_bundle
    rel, _ = _notebooks(course)
    cases = {"missing": unpack(zip_path, tmp_path / "missing"), "two": unpack(zip_path, tmp_path / "two"),
             "unreadable": unpack(zip_path, tmp_path / "unreadable"), "link": unpack(zip_path, tmp_path / "link")}
    (cases["missing"] / "submission" / "notes.txt").write_text("I forgot the notebook")
    for name in (f"{LAB}.ipynb", "copy.ipynb"):
        nbformat.write(rel, str(cases["two"] / "submission" / name))
    (cases["unreadable"] / "submission" / f"{LAB}.ipynb").write_text("{ this is not a notebook")
    (cases["link"] / "submission" / f"{LAB}.ipynb").symlink_to(course / "solutions" / LAB / f"{LAB}.ipynb")
    runs = {name: finish(start(root), root) for name, root in cases.items()}
    expected = {"missing": "no notebook was submitted", "two": "2 notebooks were submitted",
                "unreadable": "invalid notebook", "link": "cannot be read as a file"}
    for name, (code, out, results, text) in runs.items():
        assert code == 0, f"{name}: a student's mistake is a grade, not an autograder error:\n{out}"
        assert results["score"] == 0.0 and all(t["score"] == 0.0 for t in results["tests"]), results
        assert len(results["tests"]) == 2 and all(t["status"] == "failed" for t in results["tests"])
        assert results["output"].startswith("NOT GRADED: ") and expected[name] in results["output"], (name, results)
        assert_no_hidden_source(text, out)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_machine_that_cannot_grade_says_so_and_exits_non_zero(synthetic_bundle, tmp_path, no_leaked_processes):
    course, zip_path = synthetic_bundle
    rel, src = _notebooks(course)
    # the package cannot be imported (setup.sh failed): a Python without site-packages stands in
    broken = unpack(zip_path, tmp_path / "no-package")
    nbformat.write(grading.fill_solutions(rel, src), str(broken / "submission" / f"{LAB}.ipynb"))
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "python3").write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -S \"$@\"\n")
    (shim / "python3").chmod(0o755)
    code, out, results, text = finish(start(broken, path=str(shim)), broken)
    assert code == 1 and "ENVIRONMENT ERROR" in out, out
    assert "the course package does not import" in results["output"], results
    assert [t["status"] for t in results["tests"]] == ["failed", "failed"]
    assert all("cannot grade" in t["output"] for t in results["tests"])

    # the canary fails here (a submission may use 1 MB, so not even its sandbox starts): the solution itself would
    # lose, so nobody is graded
    starved = unpack(zip_path, tmp_path / "starved")
    nbformat.write(grading.fill_solutions(rel, src), str(starved / "submission" / f"{LAB}.ipynb"))
    code, out, results, text = finish(start(starved, env={"DTLABS_MEMORY_MB": "1"}), starved)
    assert code == 1, out
    assert "cannot grade this lab" in results["output"] and "the solution" in results["output"], results["output"]
    assert "the solution was not graded: sandbox:" in results["output"], results["output"]
    assert all(t["status"] == "failed" and t["output"] == results["output"] for t in results["tests"])
    assert_no_hidden_source(text, out)


def test_lab01_bundle_carries_the_course_config_and_names_every_exercise(tmp_path, wheel):
    lab = "01_ddp_setup"
    zip_path = gradescope.build(lab, tmp_path, course_root=REPO, wheel=wheel, out=lambda *_: None)
    with zipfile.ZipFile(zip_path) as zf:
        manifest = json.loads(zf.read("dtlabs-autograder.json"))
        assert zf.read("course/grader/nbgrader_config.py") == (REPO / "grader" / "nbgrader_config.py").read_bytes()
        assert zf.read(f"course/solutions/{lab}/{lab}.ipynb") == (REPO / "solutions" / lab / f"{lab}.ipynb").read_bytes()
    assert [(t["name"], t["points"], t["visibility"]) for t in manifest["tests"]][0] == (
        "Exercise 1 (3 points): `ring_all_reduce(tensor)` (test_ring_all_reduce)", 3.0, "after_published")
    assert sum(t["points"] for t in manifest["tests"]) == 10.0 and len(manifest["tests"]) == 5


FULL = os.environ.get("DTLABS_FULL", "") not in ("", "0")


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.skipif(not FULL, reason="nightly (DTLABS_FULL=1): three Lab 01 gradings (the bundle's canary and the "
                                     "submission), about a CPU-minute that make test's 10-minute budget lacks")
def test_lab01_bundle_grades_a_cheat_as_the_honest_answer_underneath(tmp_path, wheel, no_leaked_processes):
    """A real lab: Lab 01's bundle, built from the course, grades an attack from the corpus (reading the course
    through DTLABS_COURSE_ROOT) on top of an honest wrong ring all-reduce; its canary (in the bundle) gives the
    solution full marks and the release zero."""
    lab = "01_ddp_setup"
    zip_path = gradescope.build(lab, tmp_path / "out", course_root=REPO, wheel=wheel, out=lambda *_: None)
    root = unpack(zip_path, tmp_path / "ag")
    rel = nbformat.read(str(REPO / "labs" / lab / f"{lab}.ipynb"), as_version=4)
    src = nbformat.read(str(REPO / "solutions" / lab / f"{lab}.ipynb"), as_version=4)
    honest = read_known_wrong(REPO / "grader" / "known_wrong" / lab / "ring_assumes_divisible.py")
    attack = (REPO / "grader" / "cheats" / "course_root_env.py").read_text()
    nb = grading.without_demos(grading.fill_solutions(rel, src, {honest.replaces: honest.source + "\n\n\n" + attack}))
    nbformat.write(nb, str(root / "submission" / f"{lab}.ipynb"))
    code, out, results, text = finish(start(root), root, timeout=1100)
    assert code == 0, out
    assert "canary: solution 10/10, release 0/10" in out, out
    scores = {gid: t["score"] for gid, t in graded(results).items()}
    assert scores == {"test_ring_all_reduce": 0.0, "test_average_gradients": 2.0, "test_shard_indices": 2.0,
                      "test_train_data_parallel": 2.0, "test_train_ddp": 1.0}, (scores, out)
    assert results["score"] == 7.0
    hidden = [c for c in src.cells if "### BEGIN HIDDEN TESTS" in c.source]
    assert "LEAKED HIDDEN TEST" not in text + out
    for cell in hidden:  # no line of any hidden region reaches what Gradescope stores or shows
        for line in cell.source.split("### BEGIN HIDDEN TESTS")[1].split("### END HIDDEN TESTS")[0].split("\n"):
            if len(line.strip()) >= 12:
                assert line.strip() not in text and line.strip() not in out, line


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_bundle_stops_a_submission_at_the_submission_timeout(synthetic_bundle, tmp_path, no_leaked_processes):
    """`DTLABS_SUBMISSION_TIMEOUT` (as `c.DTLabs.submission_timeout`) takes effect in the bundle, as in `dtlabs grade`
    and `grade-one` (tests/grading/test_grading_cli.py)."""
    course, zip_path = synthetic_bundle
    rel, src = _notebooks(course)
    root = unpack(zip_path, tmp_path / "sleepy")
    nbformat.write(grading.fill_solutions(rel, src, {"add": "import time\ntime.sleep(600)\n\n\ndef add(a, b):\n    "
                                                            "return a + b\n\n\ndef twice(x):\n    return 2 * x"}),
                   str(root / "submission" / f"{LAB}.ipynb"))
    code, out, results, text = finish(start(root, env={"DTLABS_SUBMISSION_TIMEOUT": "25"}), root)
    assert code == 0, out
    assert "wall-clock limit: grading took over 25 s" in results["output"] + out and results["score"] < 3.0, out
    assert results["execution_time"] < 170, "stopped at 25 s, long before the 180 s cell limit"
