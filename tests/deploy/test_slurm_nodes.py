"""The course on a Slurm of two nodes that are hosts of their own (grader/slurm/local-cluster.sh up --nodes 2: each node
a network, host-name and mount namespace with its own address on a private bridge, its own slurmd and /etc/hosts;
the controller on a login host of its own; munge and the file system shared), as the instructor runs it.

- train.sbatch with its defaults (train_lab.py, one torchrun agent per node): the agents meet at the first node's
  bridge address, never loopback, and the run ends with the weights of one process training on the whole batch.
  With the first node's name on 127.0.1.1 in /etc/hosts (Debian's default line), train.sbatch refuses to start.
- A node crashes while the job trains (its slurmd and every process on it killed, its address gone): Slurm marks it
  DOWN and requeues the job (--requeue); once the node is booted again the job runs again and resumes from its
  checkpoint, not from step 0, and still ends with the same weights.
- grade-class.sh spreads a class over both nodes: each array task (2 CPUs, a whole node) runs on a node of its own.
- ``down`` leaves no daemon, host, namespace, veth or bridge behind.

The machine has one Slurm: this runs in the xdist group of test_slurm.py's grading array (which also writes the
gradebook), after it; the single-node cluster that test_slurm.py's tests share is stopped first and brought back at
the end.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import nbformat
import pytest

from deploy_helpers import REPO, TEACHER, TIMINGS, WRITES_GRADEBOOK, report, run_state, teacher_env, wait_for

from lab_utils import grading

pytestmark = [pytest.mark.deploy, pytest.mark.xdist_group(WRITES_GRADEBOOK)]  # one Slurm per machine (above)
SCRIPT = REPO / "grader" / "slurm" / "local-cluster.sh"
NODES = ["dtlabs-n1", "dtlabs-n2"]
ADDR = {"dtlabs-head": "10.77.0.1", "dtlabs-n1": "10.77.0.11", "dtlabs-n2": "10.77.0.12"}
LAB = "01_ddp_setup"
ETC_HOSTS = Path("/var/lib/slurm/dtlabs/etc-hosts")  # what every host of the cluster sees as its /etc/hosts


def cluster(*args, timeout=180, check=True) -> subprocess.CompletedProcess:
    res = subprocess.run([str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=timeout)
    if check:
        assert res.returncode == 0, f"local-cluster.sh {shlex.join(map(str, args))}: {res.stdout}{res.stderr}"
    return res


def as_teacher(course: Path, argv, *, env=None, timeout=600, check=True, on=None) -> subprocess.CompletedProcess:
    """``argv`` as the instructor on the cluster's login host (or on host ``on``), in the course folder: the only
    place the controller can be reached from."""
    env = env or teacher_env(course)
    where = ["--on", on] if on else []
    cmd = [str(SCRIPT), "exec", *where, "runuser", "-u", TEACHER, "--", "env", "-i",
           *[f"{k}={v}" for k, v in env.items()], *map(str, argv)]
    res = subprocess.run(cmd, cwd=course, capture_output=True, text=True, timeout=timeout)
    if check:
        assert res.returncode == 0, \
            f"as {TEACHER}: {shlex.join(map(str, argv))}\n{res.stdout[-3000:]}{res.stderr[-3000:]}"
    return res


def _daemons() -> list[str]:
    """What runs of the cluster: Slurm's daemons and the hosts' holders."""
    left = []
    for comm in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = comm.read_bytes().split(b"\0")
        except OSError:
            continue
        name = os.path.basename(argv[0].decode(errors="replace"))
        if name in ("slurmctld", "slurmd", "slurmstepd") or name.startswith("dtlabs-host"):
            left.append(f"{comm.parent.name} {name}")
    return left


def _network_left() -> list[str]:
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-br", "link"], capture_output=True, text=True).stdout
    return [line for line in netns.splitlines() if "dtlabs" in line] + \
        [line for line in links.splitlines() if line.startswith(("v-dtlabs", "br0"))]


def _reference(course: Path, steps: int) -> dict:
    ref = as_teacher(course, [course / ".venv" / "bin" / "python", "grader/slurm/train_lab.py", "--reference",
                              "--steps", steps])
    return json.loads(ref.stdout.split("result: ", 1)[1])


def _same_weights(result: dict, reference: dict) -> None:
    assert abs(result["weight_norm"] - reference["weight_norm"]) <= 1e-5 * reference["weight_norm"], (result, reference)
    assert abs(result["final_loss"] - reference["final_loss"]) <= 1e-4 * reference["final_loss"], (result, reference)


def _job_state(course: Path, job: str) -> str:
    out = as_teacher(course, ["squeue", "-h", "-j", job, "-o", "%T"], check=False).stdout.strip()
    return out or "GONE"


def _node_state(course: Path, node: str) -> str:
    return as_teacher(course, ["sinfo", "-h", "-n", node, "-o", "%T"]).stdout.strip()


@pytest.fixture(scope="module")
def two_nodes(passwords, course):
    for tool in ("slurmctld", "slurmd", "munged", "sbatch", "ip", "nsenter", "unshare"):
        if not shutil.which(tool):
            pytest.skip(f"not installed: {tool}; `make test-deploy` installs Slurm (.ci/install-deploy)")
    single = (run_state() / "slurm.json").is_file()  # this run's single-node cluster (conftest.py's slurm fixture)
    if single:
        cluster("down")
    t0 = time.monotonic()
    up = cluster("up", "--nodes", 2)
    TIMINGS["2-node Slurm up (local-cluster.sh up --nodes 2)"] = time.monotonic() - t0
    report(f"[slurm-nodes] {up.stdout.strip()}")
    try:
        yield
    finally:
        t0 = time.monotonic()
        down = cluster("down", check=False)
        again = cluster("down", check=False)  # idempotent: nothing left to stop
        TIMINGS["2-node Slurm down"] = time.monotonic() - t0
        left, net = _daemons(), _network_left()
        if single:  # what the other Slurm tests of this run were given
            cluster("up")
        assert down.returncode == 0 and again.returncode == 0, down.stdout + down.stderr + again.stdout + again.stderr
        assert not left, f"left running after down: {left}"
        assert not net, f"network left after down: {net}"


@pytest.mark.timeout(600)
def test_two_hosts_train_like_one(course, two_nodes):
    # each node is a host: its own name, its own address, every host's name resolving to its bridge address
    for node in NODES:
        ident = as_teacher(course, ["bash", "-c", "hostname; ip -4 -o addr show eth0; getent ahostsv4 dtlabs-n1"],
                           on=node).stdout
        assert ident.startswith(node + "\n") and f"inet {ADDR[node]}/24" in ident, ident
        assert ident.splitlines()[2].split()[0] == ADDR["dtlabs-n1"], f"dtlabs-n1 must resolve to its address:\n{ident}"
    sinfo = as_teacher(course, ["sinfo", "-h", "-N", "-o", "%N %o %T"]).stdout
    assert sorted(sinfo.split()[i] for i in (0, 3)) == NODES and ADDR["dtlabs-n2"] in sinfo, sinfo

    t0 = time.monotonic()
    job = as_teacher(course, ["sbatch", "--parsable", "--wait", "-N", "2", "--cpus-per-task=1", "--mem=2G",
                              "grader/slurm/train.sbatch"], check=False, timeout=500)
    TIMINGS["train.sbatch -N 2 (train_lab.py, 200 steps, 1 agent per node)"] = time.monotonic() - t0
    job_id = job.stdout.strip().split(";")[0]
    log = (course / f"dtlabs-train-{job_id}.out").read_text(errors="replace")
    report(f"[slurm-nodes] train.sbatch job {job_id}: " + "\n".join(
        line for line in log.splitlines() if line.startswith(("job ", "result:"))))
    assert job.returncode == 0, f"{job.stdout}{job.stderr}\n{log[-3000:]}"
    assert "2 agent(s) on 2 node(s) x 1 worker(s)" in log, log[-2000:]
    assert re.search(rf"rendezvous at dtlabs-n1:\d+ \({re.escape(ADDR['dtlabs-n1'])}\)", log), log[-2000:]
    result = json.loads(log.split("result: ", 1)[1].splitlines()[0])
    assert result["world_size"] == 2 and sorted(r["host"] for r in result["ranks"]) == NODES, result
    _same_weights(result, _reference(course, result["steps"]))

    # the classic failure: Debian's `127.0.1.1 <host name>` line makes the first node's name loopback on itself, where
    # gloo and the rendezvous would listen out of the other node's reach; train.sbatch refuses at once
    hosts = ETC_HOSTS.read_text()
    try:
        ETC_HOSTS.write_text(f"127.0.1.1 dtlabs-n1\n{hosts}")  # in place: every host's bind mount sees it
        bad = as_teacher(course, ["sbatch", "--parsable", "--wait", "-N", "2", "--cpus-per-task=1", "--mem=2G",
                                  "grader/slurm/train.sbatch"], check=False, timeout=300)
    finally:
        ETC_HOSTS.write_text(hosts)
    bad_log = (course / f"dtlabs-train-{bad.stdout.strip().split(';')[0]}.out").read_text(errors="replace")
    assert bad.returncode != 0 and "dtlabs-n1 resolves to '127.0.1.1' on itself" in bad_log, bad_log[-2000:]


@pytest.mark.timeout(900)
def test_node_crash_requeues_and_resumes(course, two_nodes):
    steps = 120
    out_file = course / "train-nodes-crash.json"
    out_file.unlink(missing_ok=True)
    t0 = time.monotonic()
    job_id = as_teacher(course, ["sbatch", "--parsable", "-N", "2", "--cpus-per-task=1", "--mem=2G",
                                 "grader/slurm/train.sbatch", "grader/slurm/train_lab.py", "--steps", steps,
                                 "--step-seconds", "0.25", "--out", out_file]).stdout.strip().split(";")[0]
    ckpt = course / "checkpoints" / job_id / "checkpoint.pt"
    wait_for(lambda: ckpt.is_file(), 300, "the job's first checkpoint")
    assert _job_state(course, job_id) == "RUNNING"
    TIMINGS["node crash: submit to first checkpoint"] = time.monotonic() - t0

    t0 = time.monotonic()
    crash = cluster("crash", "dtlabs-n2")
    report(f"[slurm-nodes] {crash.stdout.strip()}")
    wait_for(lambda: _job_state(course, job_id) == "PENDING", 180, "Slurm to requeue the job", poll=2)
    TIMINGS["node crash: to the job requeued (node DOWN after SlurmdTimeout=30)"] = time.monotonic() - t0
    sinfo = wait_for(lambda: _node_state(course, "dtlabs-n2").startswith("down") and _node_state(course, "dtlabs-n2"),
                     60, "dtlabs-n2 DOWN", poll=2)
    pending = as_teacher(course, ["squeue", "-h", "-j", job_id, "-o", "%T %r"]).stdout.strip()
    report(f"[slurm-nodes] job {job_id} after the crash: {pending}; dtlabs-n2 {sinfo}")

    # the job needs both nodes: it waits until the node is back (and Slurm holds a requeued job a while: start it now,
    # once its first run has ended on dtlabs-n1 too; started 2 s after the requeue, its srun found the nodes "busy"
    # with that run's step and waited for good)
    t0 = time.monotonic()
    cluster("up", "--nodes", 2)
    wait_for(lambda: _job_state(course, job_id) != "PENDING" or all(_node_state(course, n) == "idle" for n in NODES),
             180, "the job's first run to end on both nodes", poll=2)
    if _job_state(course, job_id) == "PENDING":
        as_teacher(course, ["scontrol", "update", f"JobId={job_id}", "StartTime=now"])
    wait_for(lambda: _job_state(course, job_id) == "GONE", 400, "the requeued job's end", poll=2)
    TIMINGS["node crash: node booted to the requeued job's end"] = time.monotonic() - t0
    show = as_teacher(course, ["scontrol", "show", "job", job_id]).stdout
    assert "JobState=COMPLETED" in show and "Restarts=1" in show, show
    log = (course / f"dtlabs-train-{job_id}.out").read_text(errors="replace")
    result = json.loads(out_file.read_text())
    report(f"[slurm-nodes] requeued job {job_id}: resumed from step {result['resumed_from']} of {steps}")
    assert 20 <= result["resumed_from"] < steps and result["resumed_from"] % 20 == 0, \
        f"the requeued job must resume from its checkpoint, not step 0: {result}\n{log[-2000:]}"
    assert sorted(r["host"] for r in result["ranks"]) == NODES, result
    _same_weights(result, _reference(course, steps))


def _reset_grading(course: Path) -> None:
    work = course / "grader" / "work"
    as_teacher(course, ["bash", "-c", f"rm -rf {shlex.quote(str(work))}/{{gradebook.db,graded.json,"
                                      "gradebook-sources.json,autograded,results,grades.csv,feedback,release}"])


@pytest.mark.timeout(900)
def test_grading_array_spreads_over_both_nodes(course, two_nodes):
    shutil.rmtree(course / "grader" / "work" / "submitted", ignore_errors=True)
    rel = nbformat.read(str(course / "labs" / LAB / f"{LAB}.ipynb"), as_version=4)
    src = nbformat.read(str(course / "solutions" / LAB / f"{LAB}.ipynb"), as_version=4)
    for student, nb in {"good": grading.fill_solutions(rel, src), "empty": rel}.items():
        grading.submit(course, student, LAB, grading.without_demos(nb))
    subprocess.run(["chown", "-R", f"{TEACHER}:", str(course / "grader" / "work")], check=True)
    _reset_grading(course)

    t0 = time.monotonic()  # the default task size, 2 CPUs: a whole node each
    res = as_teacher(course, ["grader/slurm/grade-class.sh", "--wait", LAB, "good", "empty"], check=False,
                     env=teacher_env(course, DTLABS_GRADE_ARGS="--timeout 30"), timeout=850)
    TIMINGS["grade-class.sh on 2 nodes, 2 Lab 01 submissions, to the end of the merge"] = time.monotonic() - t0
    out = res.stdout + res.stderr
    report(f"[slurm-nodes] grade-class.sh:\n{out}")
    assert res.returncode == 0 and "merged 2 of 2" in out, out
    logs = course / "grader" / "work" / "results" / "logs"
    hosts = {}
    for log in sorted(logs.glob("grade-*.out")):
        m = re.search(r"^task (\d+_\d+) on (\S+):", log.read_text(errors="replace"), re.M)
        assert m, log.read_text(errors="replace")[-2000:]
        hosts[m.group(1)] = m.group(2)
    report(f"[slurm-nodes] array tasks ran on {hosts}")
    assert sorted(hosts.values()) == NODES, f"each task on a node of its own: {hosts}"
