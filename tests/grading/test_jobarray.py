"""A class graded as a job array (``dtlabs prepare-array`` / ``grade-one`` / ``merge``) on the synthetic course, without
Slurm: the steps as array tasks and the merge job run them (tests/deploy/test_slurm.py runs them on a real Slurm).

What they protect: a rerun or requeued task starts clean and a crash never leaves an old result behind; the merge
accounts for every student of the roster (one whose task died is NOT GRADED with what its task record and log say,
never missing) and records what it merged, so ``dtlabs grade`` then regrades nothing; a merge into a gradebook that
never recorded the lab works from a job's bare PATH; tasks use the template prepared once; a node without
bubblewrap says so in the task's log and on the grade line."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.synthetic import SYNTHETIC_LAB as LAB

from lab_utils import cli, grading
from lab_utils.grading import jobarray
from lab_utils.grading.boundary import ids


def _course(synthetic_course, tmp_path, students=("ann", "bob", "cid")) -> Path:
    root = tmp_path / "course"
    shutil.copytree(synthetic_course, root)
    import nbformat

    rel = nbformat.read(str(root / "labs" / LAB / f"{LAB}.ipynb"), as_version=4)
    src = nbformat.read(str(root / "solutions" / LAB / f"{LAB}.ipynb"), as_version=4)
    for s in students:
        grading.submit(root, s, LAB, grading.fill_solutions(rel, src))
    return root


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_array_tasks_rerun_clean_and_merge_accounts_for_everyone(synthetic_course, tmp_path, monkeypatch, capsys,
                                                                no_leaked_processes):
    root = _course(synthetic_course, tmp_path)
    results = tmp_path / "results"
    args = ["--out", str(results), "--course-root", str(root)]
    assert cli.main(["prepare-array", LAB, *args]) == 0
    assert capsys.readouterr().out.strip() == "3"
    assert jobarray.read_roster(results, LAB) == ["ann", "bob", "cid"]

    # task 0 graded twice into the same folder (a rerun, or `scontrol requeue`): the second must not crash
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "77")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "0")
    for _ in range(2):
        assert cli.main(["grade-one", LAB, "--task", "0", *args]) == 0
        assert "ann/00_synthetic: 3/3" in capsys.readouterr().out
    ann = json.loads((results / LAB / "ann" / "result.json").read_text())
    assert ann["template"] == str(results / LAB / "template"), "a task must use the template prepared once"
    assert not (results / LAB / "ann" / "template").exists()
    assert ann["job"] == "77_0" and ann["digest"]

    # task 1 graded once, then rerun and killed mid-grading: its old result must be gone, not merged as if current
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "1")
    assert cli.main(["grade-one", LAB, "--task", "1", *args]) == 0
    (results / "logs" / "grade-77_1.out").write_text(
        "task 77_1 on node7\nslurmstepd: error: *** JOB 78 ON node7 CANCELLED AT 2024-05-01T10:00:00 DUE TO TIME LIMIT ***\n")

    def killed(*a, **k):
        raise KeyboardInterrupt  # what SIGTERM from Slurm does to the task: nothing after this line runs

    monkeypatch.setattr(jobarray, "grade_submission", killed)
    with pytest.raises(KeyboardInterrupt):
        jobarray.grade_one(root, LAB, results, task=1)
    monkeypatch.undo()
    assert not (results / LAB / "bob" / "result.json").exists(), "a rerun that died left the old result behind"
    assert grading.cell_scores(root, LAB, "ann") == {}, "a task must not write the course's gradebook"
    # task 2 (cid) never ran at all

    assert cli.main(["merge", str(results), "--course-root", str(root)]) == 1
    out = capsys.readouterr().out
    assert "ann/00_synthetic: 3/3" in out
    assert "NOT GRADED: bob/00_synthetic (no result: array task 77_1 started on" in out
    assert "DUE TO TIME LIMIT" in out, "the merge should quote the dead task's log"
    assert "NOT GRADED: cid/00_synthetic (no result: no array task started" in out
    assert "merged 1 of 3" in out
    assert grading.cell_scores(root, LAB, "ann") == {"test_add": (2.0, 2.0), "test_twice": (1.0, 1.0)}

    # the documented next step grades only the two the array did not, and exports everyone
    assert cli.main(["grade", LAB, "--no-feedback", "--course-root", str(root)]) == 0
    out = capsys.readouterr().out
    assert "3 submission(s), 2 to grade (1 unchanged since last graded" in out, out
    rows = {r["student_id"]: r for r in grading.read_grades_csv(root / "grader" / "work" / "grades.csv")}
    assert {s: float(r["score"]) for s, r in rows.items()} == {"ann": 3.0, "bob": 3.0, "cid": 3.0}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_merge_job_on_a_gradebook_without_the_lab(synthetic_course, tmp_path, no_leaked_processes):
    """As a merge job runs: ``.venv/bin/dtlabs`` with a bare PATH (no venv bin: no ``alembic``), into a course
    whose gradebook does not exist yet; and a task on a node without bubblewrap says so."""
    root = _course(synthetic_course, tmp_path, students=("dee",))
    shutil.rmtree(root / "grader" / "work" / "autograded", ignore_errors=True)
    (root / "grader" / "work" / "gradebook.db").unlink()
    results = tmp_path / "results"
    dtlabs = [sys.executable, "-m", "lab_utils.cli"]
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV",)}
    env["PATH"] = "/usr/bin:/bin"
    env["DTLABS_SANDBOX"] = "unprotected"  # a node without bubblewrap, graded without a boundary by name
    task = subprocess.run([*dtlabs, "grade-one", LAB, "dee", "--out", str(results), "--course-root", str(root)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert task.returncode == 0, task.stdout + task.stderr
    assert "WARNING: dtlabs: grading WITHOUT A BOUNDARY" in task.stderr
    assert "dee/00_synthetic: 3/3 - sandbox: taken without a boundary (--unprotected)" in task.stdout
    assert not (root / "grader" / "work" / "gradebook.db").exists(), "a task must not create the course's gradebook"
    env.pop("DTLABS_SANDBOX")
    merge = subprocess.run([*dtlabs, "merge", str(results), "--course-root", str(root)],
                           env=env, capture_output=True, text=True, timeout=300)
    assert merge.returncode == 0, merge.stdout + merge.stderr
    assert "dee/00_synthetic: 3/3 - sandbox: taken without a boundary (--unprotected)" in merge.stdout
    assert grading.cell_scores(root, LAB, "dee") == {"test_add": (2.0, 2.0), "test_twice": (1.0, 1.0)}


def test_merge_with_nothing_to_merge_fails(tmp_path, capsys):
    (tmp_path / "solutions").mkdir()
    assert cli.main(["merge", str(tmp_path / "results"), "--course-root", str(tmp_path)]) == 2
    assert "nothing to merge" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_task_on_a_node_that_cannot_grade_the_lab_grades_no_one(synthetic_course, tmp_path, capsys,
                                                                 no_leaked_processes):
    """Each task runs the lab's canary first (as ``dtlabs grade`` does): a node where the lab's own solution does not
    earn full marks records NOT GRADED with the canary's reason, never a zero."""
    root = _course(synthetic_course, tmp_path, students=("ann",))
    results = tmp_path / "results"
    args = ["--out", str(results), "--course-root", str(root)]
    assert cli.main(["prepare-array", LAB, *args]) == 0
    source = root / "solutions" / LAB / f"{LAB}.ipynb"  # what this node has cannot grade: its solution is wrong
    source.write_text(source.read_text().replace("return a + b", "return a - b"))
    capsys.readouterr()
    assert cli.main(["grade-one", LAB, "--task", "0", *args]) == 1
    out = capsys.readouterr().out
    ann = json.loads((results / LAB / "ann" / "result.json").read_text())
    assert not ann["graded"], ann
    assert "the lab's own solution got 1/3" in " ".join(ann["reasons"]), ann["reasons"]
    assert "ann/00_synthetic: NOT GRADED" in out
    assert cli.main(["merge", str(results), "--course-root", str(root)]) == 1
    assert "NOT GRADED: ann/00_synthetic" in capsys.readouterr().out
    assert grading.cell_scores(root, LAB, "ann") == {}, "nothing of a node that cannot grade reaches the gradebook"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_ids_at_the_door_of_the_array_and_a_named_student_without_a_submission(synthetic_course, tmp_path, capsys,
                                                                                 no_leaked_processes):
    """`prepare-array LAB a b ghost` never refuses the whole class for ghost, and a newline in an id never adds
    roster lines (a '.' line would delete the shared template, '..' write above the results folder, a classmate be
    graded twice): ghost is MISSING (prepare, then merge), an id that breaks the rule is NOT GRADED and never a roster line or a
    folder, a roster line edited to '.' or '..' grades nothing and deletes nothing, and the rest is graded."""
    root = _course(synthetic_course, tmp_path, students=("ann", "bob"))
    results = tmp_path / "results"
    args = ["--out", str(results), "--course-root", str(root)]
    injected = "bob\n.\n..\nann"
    assert cli.main(["prepare-array", LAB, "ann", "ghost", injected, "=1+1", *args]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == "1", captured
    assert jobarray.read_roster(results, LAB) == ["ann"]
    assert f"MISSING: ghost/{LAB}" in captured.err and f"NOT GRADED: {injected!r}/{LAB} (the student id holds a " \
        "control" in captured.err and f"NOT GRADED: '=1+1'/{LAB} (the student id begins with '='" in captured.err, \
        captured.err
    assert "\nbob\n" not in captured.err

    template = results / LAB / "template"
    for line in (".", "..", "x/../../escaped", "template"):  # a roster edited by hand, or a STUDENT to grade-one
        (results / LAB / "roster.txt").write_text(f"{line}\n")
        assert cli.main(["grade-one", LAB, "--task", "0", *args]) == 2
        assert f"{ids.shown(line)}/{LAB}: NOT GRADED - the student id " in capsys.readouterr().out
        assert cli.main(["grade-one", LAB, line, *args]) == 2
        capsys.readouterr()
    assert (template / "grader" / "work" / "gradebook.db").is_file(), "the shared template was deleted"
    assert sorted(p.name for p in results.iterdir()) == [LAB, "logs"] and not (tmp_path / "escaped").exists()
    assert sorted(p.name for p in (results / LAB).iterdir()) == ["missing.txt", "roster.txt", "template"]

    (results / LAB / "roster.txt").write_text("ann\n")
    assert cli.main(["grade-one", LAB, "--task", "0", *args]) == 0
    assert cli.main(["merge", str(results), "--course-root", str(root)]) == 1, "ghost is missing: the merge says so"
    out = capsys.readouterr().out
    assert f"ann/{LAB}: 3/3" in out and f"MISSING: ghost/{LAB} (named to prepare-array, but no submission)" in out, out
    assert "merged 1 of 2" in out, out
    assert grading.cell_scores(root, LAB, "ann") == {"test_add": (2.0, 2.0), "test_twice": (1.0, 1.0)}


# Stands in for Slurm's sbatch where there is none: runs the script here as Slurm would on a node (each array task in
# turn with its SLURM_* variables, its output in the --output file), prints what sbatch prints, --test-only accepts.
FAKE_SBATCH = r"""#!/usr/bin/env bash
array=""; output=""; testonly=0
while [ $# -gt 0 ]; do
    case "$1" in
        --test-only) testonly=1 ;;
        --array=*) array="${1#--array=}" ;;
        --output=*) output="${1#--output=}" ;;
        --*) ;;
        *) break ;;
    esac
    shift
done
[ "$testonly" = 1 ] && exit 0
script="$1"; shift
job=$(( $(cat "$0.next" 2>/dev/null || echo 100) + 1 )); echo "$job" > "$0.next"
if [ -n "$array" ]; then
    range="${array%%\%*}"
    for i in $(seq "${range%-*}" "${range#*-}"); do
        log="${output//%A/$job}"; log="${log//%a/$i}"
        SLURM_ARRAY_JOB_ID=$job SLURM_ARRAY_TASK_ID=$i SLURM_SUBMIT_DIR="$PWD" bash "$script" "$@" >"$log" 2>&1 || true
    done
    echo "$job"
    exit 0
fi
log="${output//%j/$job}"
rc=0
SLURM_JOB_ID=$job SLURM_SUBMIT_DIR="$PWD" bash "$script" "$@" >"$log" 2>&1 || rc=$?
echo "Submitted batch job $job"
exit "$rc"
"""


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_grade_class_grades_the_students_given_and_reports_one_without_a_submission(synthetic_course, tmp_path,
                                                                                      no_leaked_processes):
    """`grade-class.sh --wait LAB ann bob ghost` refused the whole class at the door because ghost (on the roster)
    submitted nothing. Now ann and bob are graded and merged, and ghost is reported MISSING (exit 1: someone is)."""
    from helpers import REPO

    root = _course(synthetic_course, tmp_path, students=("ann", "bob"))
    shutil.copytree(REPO / "grader" / "slurm", root / "grader" / "slurm")
    shutil.copy(REPO / "grader" / "nbgrader_config.py", root / "grader")  # a course folder the script finds itself in
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(FAKE_SBATCH)
    (bin_dir / "sbatch").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "DTLABS_VENV": str(Path(sys.executable).parents[1])}
    run = subprocess.run(["bash", str(root / "grader" / "slurm" / "grade-class.sh"), "--wait", LAB, "ann", "bob",
                          "ghost"], env=env, capture_output=True, text=True, timeout=500)
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    assert f"MISSING: ghost/{LAB}" in run.stderr, "prepare-array says so at once"
    assert f"ann/{LAB}: 3/3" in run.stdout and f"bob/{LAB}: 3/3" in run.stdout, out
    assert f"MISSING: ghost/{LAB} (named to prepare-array, but no submission)" in run.stdout, out
    assert "merged 2 of 3" in run.stdout, out
    assert {s: grading.cell_scores(root, LAB, s) for s in ("ann", "bob")} == {
        s: {"test_add": (2.0, 2.0), "test_twice": (1.0, 1.0)} for s in ("ann", "bob")}
