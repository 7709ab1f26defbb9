"""nbgrader runs forked from the warm server (lab_utils/grading/nbgrader_run.py) are the runs a fresh
``python -m nbgrader`` would be: each its own environment, folder, ``sys.path`` and exit code, none seeing what an
earlier one changed, stopped with what it started at its time limit; the server belongs to no run and ends with
the process that started it.

A probe course's ``grader/nbgrader_config.py`` (which nbgrader executes in every run) prints what the run sees.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from lab_utils import processes
from lab_utils.grading import nbgrader_run

PROBE = '''
import json, os, sys
print("PROBE " + json.dumps({"cwd": os.getcwd(), "value": os.environ.get("DTLABS_PROBE"), "path0": sys.path[0],
                             "seen": getattr(json, "_dtlabs_probe_seen", 0), "pid": os.getpid(),
                             "ppid": os.getppid()}), flush=True)
json._dtlabs_probe_seen = getattr(json, "_dtlabs_probe_seen", 0) + 1   # state a later run must not see
if os.environ.get("DTLABS_PROBE") == "gradebook":
    import nbgrader.api
    print("ALEMBIC " + nbgrader.api.get_alembic_version.__qualname__, flush=True)
if os.environ.get("DTLABS_PROBE") == "hang":
    import time
    time.sleep(120)
if os.environ.get("DTLABS_PROBE") == "fail":
    raise SystemExit(3)
'''


@pytest.fixture
def probe_course(tmp_path):
    root = tmp_path / "probe course"
    (root / "grader").mkdir(parents=True)
    (root / "solutions").mkdir()
    (root / "grader" / "nbgrader_config.py").write_text(PROBE)
    return root


def _probe(run) -> dict:
    line = next((x for x in run.output.splitlines() if x.startswith("PROBE ")), None)
    assert line, f"the probe config did not run (exit {run.returncode}):\n{run.output[-2000:]}"
    return json.loads(line[len("PROBE "):])


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _run(root, value, **kw):
    return nbgrader_run.run_nbgrader(["db", "student", "list"], course_root=root, env_extra={"DTLABS_PROBE": value},
                                     **kw)


def test_each_warm_run_has_its_own_environment_folder_and_path_and_sees_no_earlier_run(probe_course, monkeypatch):
    monkeypatch.setenv("DTLABS_WARM_NBGRADER", "1")
    first, second = _run(probe_course, "first"), _run(probe_course, "second")
    a, b = _probe(first), _probe(second)
    assert first.returncode == 0 and second.returncode == 0, first.output + second.output
    assert (a["value"], b["value"]) == ("first", "second")
    assert a["cwd"] == b["cwd"] == a["path0"] == str(probe_course.resolve())
    assert a["seen"] == b["seen"] == 0, "a run saw module state an earlier run left"
    assert a["ppid"] == b["ppid"] != os.getpid(), "the runs were not forked by one warm server"
    server = psutil.Process(a["ppid"])
    assert not any("TOKEN" in k for k in server.environ()), "the server carries a process token"


def test_a_new_gradebook_is_stamped_as_nbgrader_stamps_it_without_an_alembic_process(tmp_path, monkeypatch):
    """nbgrader stamps a new gradebook with the head ``alembic heads`` prints (a process per gradebook: the cold run);
    runs forked from the server get the same head from alembic's API, found once."""
    import sqlite3

    stamped = {}
    for warm in ("1", "0"):
        root = tmp_path / f"course {warm}"
        (root / "grader").mkdir(parents=True)
        (root / "solutions").mkdir()
        (root / "grader" / "nbgrader_config.py").write_text(PROBE)
        monkeypatch.setenv("DTLABS_WARM_NBGRADER", warm)
        run = _run(root, "gradebook")
        assert run.returncode == 0, run.output[-2000:]
        asked = next(x for x in run.output.splitlines() if x.startswith("ALEMBIC "))
        assert ("_alembic_head_once" in asked) == (warm == "1"), asked
        db = next(root.rglob("gradebook.db"))
        with sqlite3.connect(db) as con:
            stamped[warm] = con.execute("SELECT version_num FROM alembic_version").fetchall()
    assert stamped["1"] == stamped["0"] == [(nbgrader_run.alembic_head(),)]


def test_a_warm_run_gives_what_a_cold_run_gives(probe_course, monkeypatch):
    monkeypatch.setenv("DTLABS_WARM_NBGRADER", "1")
    warm = _run(probe_course, "same")
    monkeypatch.setenv("DTLABS_WARM_NBGRADER", "0")
    cold = _run(probe_course, "same")
    w, c = _probe(warm), _probe(cold)
    assert c["ppid"] == os.getpid() and w["ppid"] != os.getpid()
    assert {k: w[k] for k in ("cwd", "value", "path0", "seen")} == {k: c[k] for k in ("cwd", "value", "path0", "seen")}
    assert warm.returncode == cold.returncode == 0
    assert [x for x in warm.output.splitlines() if not x.startswith("PROBE")] == \
        [x for x in cold.output.splitlines() if not x.startswith("PROBE")]


def test_a_warm_run_keeps_its_exit_code_and_is_stopped_at_its_time_limit(probe_course, monkeypatch):
    monkeypatch.setenv("DTLABS_WARM_NBGRADER", "1")
    failed = _run(probe_course, "fail")
    assert failed.returncode == 3, failed.output
    hung = _run(probe_course, "hang", timeout=5)
    info = _probe(hung)
    assert hung.timed_out and hung.seconds < 30, hung
    assert not _alive(info["pid"])


def test_the_server_ends_with_the_process_that_started_it(probe_course, tmp_path):
    script = tmp_path / "grade.py"
    script.write_text(textwrap.dedent(f"""
        import json, os
        os.environ["DTLABS_WARM_NBGRADER"] = "1"
        from lab_utils.grading import nbgrader_run
        run = nbgrader_run.run_nbgrader(["db", "student", "list"], course_root={str(probe_course)!r})
        print(next(x for x in run.output.splitlines() if x.startswith("PROBE ")), flush=True)
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    line = next((x for x in out.stdout.splitlines() if x.startswith("PROBE ")), None)
    assert line, out.stdout + out.stderr
    server = json.loads(line[len("PROBE "):])["ppid"]
    try:
        psutil.Process(server).wait(timeout=10)
    except psutil.NoSuchProcess:
        pass
    except psutil.TimeoutExpired:
        pytest.fail(f"the warm server {server} outlived the process that started it")


def test_a_run_dies_with_a_server_killed_before_it_reported_the_run(probe_course):
    """The server forks a run and is killed before the caller reads the run's pid: the caller then starts the run cold,
    so the forked one must not go on grading beside it."""
    import socket

    from lab_utils import warm

    env = {**nbgrader_run.nbgrader_env(probe_course), "DTLABS_PROBE": "hang"}
    server = warm.Server(nbgrader_run.NBGRADER, env)
    server.wait_ready()
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    conn.connect(server.address)
    r, w = os.pipe()
    devnull = os.open(os.devnull, os.O_RDONLY)
    run = None
    try:
        request = {"argv": ["db", "student", "list"], "env": env, "cwd": str(probe_course), "umask": 0o022,
                   "rlimits": {}}
        socket.send_fds(conn, [json.dumps(request).encode()], [devnull, w, w])
        os.close(w)
        with os.fdopen(r, "r", errors="replace") as out:
            line = next((x for x in out if x.startswith("PROBE ")), None)  # the run is up, hanging in its config
            assert line, "the forked run printed nothing"
            run = json.loads(line[len("PROBE "):])["pid"]
            server.proc.kill()  # the caller has not read the run's pid
            server.proc.wait()
            deadline = time.monotonic() + 10
            while _alive(run):
                assert time.monotonic() < deadline, f"run {run} outlived its server by 10 s"
                time.sleep(0.1)
    finally:
        os.close(devnull)
        conn.close()
        server.stop()
        if run is not None:
            processes.killpg_quiet(run)  # the run leads its own session


def test_what_a_killed_grading_left_in_the_temp_folder_the_next_run_removes(probe_course, tmp_path, monkeypatch):
    """A grading killed outright (SIGKILL: a scheduler's limit, the OOM killer) runs no cleanup: its scratch folders
    (a submission's copy, the class's template, nbgrader's run folder) stay. Each is named for the process that
    made it, and the next nbgrader run removes those of dead gradings, not a live one's."""
    from lab_utils.grading import scratch

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    made = subprocess.run(  # a grading that made its folders and was killed before removing them
        [sys.executable, "-c", "import sys; from lab_utils.grading import scratch; "
         "print('\\n'.join(scratch.make(p, tag='lab', dir=sys.argv[1]) for p in scratch.PREFIXES))", str(tmp)],
        capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": processes.python_path()})
    dead = made.stdout.split()
    assert len(dead) == len(scratch.PREFIXES) and all(os.path.isdir(d) for d in dead), made.stdout
    live = scratch.make("dtlabs-grade-", tag="lab", dir=str(tmp))  # this process's: a grading still running
    run = _run(probe_course, "after-a-kill")
    assert run.returncode == 0, run.output
    assert sorted(os.listdir(tmp)) == [os.path.basename(live)], "left: " + ", ".join(sorted(os.listdir(tmp)))
