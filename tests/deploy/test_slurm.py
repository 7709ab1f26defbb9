"""The course on a real Slurm (grader/slurm/local-cluster.sh: one node, Debian's slurm-wlm and munge), as the
instructor, an ordinary user with the course in a folder under /tmp whose name has a space and a non-ASCII
letter, runs it (grader/README.md, "Running the course").

- A class of Lab 01 submissions (good, empty, known-wrong, a cheat from grader/cheats, one whose cell never ends,
  one more good one whose task is cancelled before it runs) graded by ``grade-class.sh --wait`` on a fresh course
  (no results folder yet: the tasks' logs must still open): the merge lists the cancelled student NOT GRADED with
  the reason, and every other student's gradebook scores equal what ``dtlabs grade --jobs 2`` gave for the same
  folder. ``dtlabs grade`` afterwards grades only the cancelled one. A requeued task (``scontrol requeue``) grades
  again and merges. A task the partition can never run is refused at submission with the partition's sizes.
- train.sbatch as one job of 2 tasks on the node (srun, one torchrun agent each, c10d rendezvous on the first node),
  training the shipped train_lab.py with a failure on purpose: torchrun restarts the workers, they resume from the
  job's checkpoint, and the result equals one process training on the whole batch.
"""
from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import nbformat
import pytest

from deploy_helpers import (
    APART, REPO, TEACHER, TIMINGS, WRITES_GRADEBOOK, popen_as, report, run_as, teacher_env, wait_for,
)

from lab_utils import grading

pytestmark = pytest.mark.deploy  # each test's xdist_group says which worker runs it (conftest.py)
LAB = "01_ddp_setup"
CELL_TIMEOUT = 30
# "hangs" first: its task waits out the cell limit while the others grade beside it (last, it would hold the run's
# end alone); "late" last: its task is cancelled before it starts
ROSTER = ["hangs", "good", "empty", "wrong", "cheat", "late"]
GOOD = ROSTER.index("good")


def _class_folder(course: Path, students) -> None:
    """Every kind of submission an array must handle, in grader/work/submitted/ (where `nbgrader collect` puts them)."""
    from helpers.known_wrong import read_known_wrong

    rel = nbformat.read(str(course / "labs" / LAB / f"{LAB}.ipynb"), as_version=4)
    src = nbformat.read(str(course / "solutions" / LAB / f"{LAB}.ipynb"), as_version=4)
    wrong = read_known_wrong(REPO / "grader" / "known_wrong" / LAB / "no_divide_by_world_size.py")
    honest = read_known_wrong(REPO / "grader" / "known_wrong" / LAB / "ring_assumes_divisible.py")
    cheat = (REPO / "grader" / "cheats" / "noop_checks.py").read_text()
    hang = "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    time.sleep(1)"
    subs = {
        "good": grading.fill_solutions(rel, src),
        "empty": rel,
        "wrong": grading.fill_solutions(rel, src, {wrong.replaces: wrong.source}),
        "cheat": grading.fill_solutions(rel, src, {honest.replaces: honest.source + "\n\n\n" + cheat}),
        "hangs": grading.fill_solutions(rel, src, {"ring_all_reduce": hang}),
        "late": grading.fill_solutions(rel, src),
    }
    for student in students:
        grading.submit(course, student, LAB, grading.without_demos(subs[student]))
    subprocess.run(["chown", "-R", f"{TEACHER}:", str(course / "grader" / "work")], check=True)


def _scores(course: Path) -> dict:
    """student -> {cell: [score, max]} from the course's gradebook, read as the instructor (never as root: the
    gradebook must stay theirs)."""
    code = (
        "import json, sys\nfrom lab_utils import grading\nfrom lab_utils.grading.course import submissions\n"
        f"c = sys.argv[1]\nprint(json.dumps({{s: grading.cell_scores(c, {LAB!r}, s) for s in submissions(c).get({LAB!r}, [])}}))"
    )
    out = run_as(TEACHER, [course / ".venv" / "bin" / "python", "-c", code, course], cwd=course, env=teacher_env(course))
    return {s: {k: list(v) for k, v in cells.items()} for s, cells in json.loads(out.stdout).items()}


def _reset_grading(course: Path) -> None:
    """Forget every grade (the submissions stay): the array then starts from a course that never graded this lab."""
    work = course / "grader" / "work"
    run_as(TEACHER, f"rm -rf {shlex.quote(str(work))}/{{gradebook.db,graded.json,gradebook-sources.json,autograded,"
                    f"results,grades.csv,feedback,release}}", cwd=course)


def _queue_empty(user: str) -> bool:
    out = run_as(user, ["squeue", "-h", "-u", user, "-o", "%i %T"], check=False)
    return out.returncode == 0 and not out.stdout.strip()


@pytest.mark.timeout(1500)
@pytest.mark.xdist_group(WRITES_GRADEBOOK)
def test_grading_array_equals_dtlabs_grade(course, slurm):
    shutil.rmtree(course / "grader" / "work" / "submitted", ignore_errors=True)  # this class only
    _class_folder(course, ROSTER[:-1])
    env = teacher_env(course)
    dtlabs = str(course / ".venv" / "bin" / "dtlabs")

    # the same folder through dtlabs grade, two at a time: what the array must reproduce
    _reset_grading(course)
    t0 = time.monotonic()
    direct = run_as(TEACHER, [dtlabs, "grade", LAB, "--jobs", "2", "--timeout", CELL_TIMEOUT, "--no-feedback"],
                    cwd=course, env=env, check=False, timeout=900)
    TIMINGS[f"dtlabs grade --jobs 2, {len(ROSTER) - 1} Lab 01 submissions"] = time.monotonic() - t0
    assert direct.returncode == 0, direct.stdout + direct.stderr
    expected = _scores(course)
    assert set(expected) == set(ROSTER[:-1]), direct.stdout
    full = sum(m for _, m in expected["good"].values())
    total = {s: sum(v for v, _ in cells.values()) for s, cells in expected.items()}
    TIMINGS["layout (a) make install under /tmp, bubblewrap: points good/empty/wrong"] = \
        f"{total['good']:g}/{full:g} {total['empty']:g}/{full:g} {total['wrong']:g}/{full:g}"
    assert total["good"] == full and total["empty"] == 0 and 0 < total["wrong"] < full, total
    assert expected["cheat"]["test_ring_all_reduce"][0] == 0, "the cheat must not pass the cell it attacks"
    assert expected["hangs"]["test_ring_all_reduce"][0] == 0 and "ran past its time limit" in direct.stdout

    # the array on a course that never graded the lab, with no results folder: as grader/README.md says to run it
    _reset_grading(course)
    _class_folder(course, ROSTER[-1:])  # one more student, whose task will not run
    results = course / "grader" / "work" / "results"
    assert not results.exists()
    t0 = time.monotonic()
    proc = popen_as(TEACHER, shlex.join(["grader/slurm/grade-class.sh", "--wait", LAB, *ROSTER]), cwd=course,
                    env={**env, "DTLABS_SLURM_CPUS": "1", "DTLABS_SLURM_MEM": "4G",
                         "DTLABS_GRADE_ARGS": f"--timeout {CELL_TIMEOUT}"})
    lines = []
    for line in proc.stdout:  # cancel the last task while it still waits for a CPU
        lines.append(line)
        m = re.search(r"array job (\d+)", line)
        if m:
            array_job = m.group(1)
            run_as(TEACHER, ["scancel", f"{array_job}_{len(ROSTER) - 1}"])
            break
    else:
        pytest.fail("grade-class.sh printed no array job:\n" + "".join(lines))
    out = "".join(lines) + proc.stdout.read()
    rc = proc.wait(timeout=900)
    TIMINGS[f"Slurm array, {len(ROSTER) - 1} Lab 01 submissions (+1 cancelled), to the end of the merge"] = \
        time.monotonic() - t0
    report(f"[slurm] grade-class.sh:\n{out}")
    assert rc == 1, f"the merge must fail when a student was not graded:\n{out}"
    assert "NOT GRADED: late/01_ddp_setup (no result: no array task started" in out, out
    assert "merged 5 of 6" in out, out
    logs = sorted(p.name for p in (results / "logs").iterdir())
    assert [f"grade-{array_job}_{i}.out" for i in range(5)] == [n for n in logs if n.startswith("grade-")], logs
    per_task = {s: json.loads((results / LAB / s / "result.json").read_text())["seconds"] for s in ROSTER[:-1]}
    per_grade = dict(re.findall(r"^\s+(\w+)/01_ddp_setup: [\d.]+/[\d.]+ \((\d+) s\)", direct.stdout, re.M))
    report(f"[slurm] seconds per submission: array task {per_task}; dtlabs grade --jobs 2 {per_grade}")
    got = _scores(course)
    assert {s: got[s] for s in ROSTER[:-1]} == {s: expected[s] for s in ROSTER[:-1]}, \
        f"the array and dtlabs grade disagree:\narray: {got}\ngrade: {expected}"

    # the documented next step grades only what the array did not
    after = run_as(TEACHER, [dtlabs, "grade", LAB, "--timeout", CELL_TIMEOUT, "--no-feedback"], cwd=course, env=env,
                   check=False, timeout=600)
    assert after.returncode == 0, after.stdout + after.stderr
    assert "6 submission(s), 1 to grade (5 unchanged since last graded" in after.stdout, after.stdout
    assert _scores(course)["late"] == expected["good"]

    # a requeued task grades again into its own folder, and the merge takes the new result
    before = json.loads((results / LAB / "good" / "result.json").read_text())
    run_as(TEACHER, ["scontrol", "requeue", f"{array_job}_{GOOD}"])
    # Slurm holds a requeued job for two minutes (BeginTime); its owner may start it now
    run_as(TEACHER, ["scontrol", "update", f"JobId={array_job}_{GOOD}", "StartTime=now"])
    wait_for(lambda: json.loads((results / LAB / "good" / "result.json").read_text()).get("finished")
             != before["finished"] if (results / LAB / "good" / "result.json").is_file() else False,
             300, "the requeued task's new result")
    wait_for(lambda: _queue_empty(TEACHER), 120, "the requeued task to leave the queue")
    merge = run_as(TEACHER, [dtlabs, "merge", results, "--lab", LAB], cwd=course, env=env, check=False)
    assert merge.returncode == 0, merge.stdout + merge.stderr
    assert "good/01_ddp_setup: " in merge.stdout and "late/01_ddp_setup: kept the grade" in merge.stdout, merge.stdout
    assert _scores(course) == {**expected, "late": expected["good"]}

    # a task no node of the partition can run is refused at submission, with the partition's sizes
    refused = run_as(TEACHER, ["grader/slurm/grade-class.sh", LAB], cwd=course, check=False, timeout=120,
                     env={**env, "DTLABS_SLURM_CPUS": "64"})
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "Slurm would never run a task asking for --cpus-per-task=64" in refused.stderr, refused.stderr
    assert re.search(r"partition debug\*?: 1 node\(s\), \d+ CPUs", refused.stderr), refused.stderr
    assert _queue_empty(TEACHER)


@pytest.mark.timeout(600)
@pytest.mark.xdist_group(APART)
def test_train_sbatch_two_agents_restart_and_resume(course, slurm):
    env = teacher_env(course)
    out_file = course / "train-result.json"
    torchrun_tmp = set(Path("/tmp").glob("torchelastic_*"))  # what torchrun leaves in a node's /tmp without --log-dir
    t0 = time.monotonic()
    job = run_as(TEACHER, ["sbatch", "--parsable", "--wait", "--nodes=1", "--ntasks=2", "--ntasks-per-node=2",
                           "--cpus-per-task=1", "--mem=2G", "grader/slurm/train.sbatch", "grader/slurm/train_lab.py",
                           "--steps", "40", "--fail-at-step", "25", "--out", out_file],
                 cwd=course, env=env, check=False, timeout=500)
    TIMINGS["train.sbatch, 2 tasks x 1 worker, one restart"] = time.monotonic() - t0
    job_id = job.stdout.strip().split(";")[0]
    log = (course / f"dtlabs-train-{job_id}.out").read_text(errors="replace")
    report(f"[slurm] train.sbatch job {job_id}: " + "\n".join(
        line for line in log.splitlines() if line.startswith(("job ", "no GPU", "result:"))))
    assert job.returncode == 0, f"{job.stdout}{job.stderr}\n{log[-3000:]}"
    assert "2 agent(s) on 1 node(s) x 1 worker(s), 1 thread(s) each" in log, log[-2000:]
    assert f"checkpoints in {course}/checkpoints/{job_id}" in log, "checkpoints must be keyed by the job id"
    assert (course / "checkpoints" / job_id / "torchrun").is_dir(), "torchrun's logs belong beside the checkpoints"
    assert not set(Path("/tmp").glob("torchelastic_*")) - torchrun_tmp, "the agents left their logs in the node's /tmp"
    result = json.loads(out_file.read_text())
    assert result["world_size"] == 2 and sorted(r["agent"] for r in result["ranks"]) == [0, 1], result
    assert max(r["restarts"] for r in result["ranks"]) == 1 and result["resumed_from"] == 20, \
        f"the failure at step 25 should restart the workers, resuming from the step-20 checkpoint: {result}"
    ref = run_as(TEACHER, [course / ".venv" / "bin" / "python", "grader/slurm/train_lab.py", "--reference",
                           "--steps", "40"], cwd=course, env=env)
    reference = json.loads(ref.stdout.split("result: ", 1)[1])
    assert result["final_loss"] < result["first_loss"] / 10, result
    assert abs(result["final_loss"] - reference["final_loss"]) <= 1e-4 * reference["final_loss"], (result, reference)
