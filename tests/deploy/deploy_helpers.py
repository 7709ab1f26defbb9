"""Running things as the course's users do: unprivileged Unix accounts, a course in a home folder whose path has a
space, commands through ``runuser`` with a login-like environment. Used by the deployment tests (tests/deploy/)."""
from __future__ import annotations

import fcntl
import json
import os
import pwd
import shlex
import shutil
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TEACHER = "dtl-teacher"
STUDENTS = ("dtl-alice", "dtl-bob")
GROUPS = {TEACHER: "dtlabs-instructors", **{s: "dtlabs-students" for s in STUDENTS}}
COURSE_NAME = "Distributed Labs"  # a space in the path, as real folders have
# the course lives below /tmp (which the sandbox replaces by a private one) in a folder whose name has a space and a
# non-ASCII letter: the layout that once graded every submission 0 (tests/deploy/test_layouts.py)
COURSE_PARENT = Path("/tmp/dtlabs courses \u00fc")
TORCH_SPEC = os.environ.get("TORCH_SPEC", "torch==2.13.0")
SYSTEM_PYTHON = "/usr/bin/python3"  # every user can run it (the pyenv under /root is mode 700)
# xdist_group names (conftest.py): the tests that write the course's gradebook share one worker, the others the second
WRITES_GRADEBOOK, APART = "writes-the-gradebook", "apart"
TIMINGS: dict = {}  # what the deployment took (seconds), printed at the end of the run by conftest.py
REPORT: list = []  # what the deployment said on the way ([hub] ..., [slurm] ...), printed with TIMINGS


def report(line: str) -> None:
    """A line for the run's report (under pytest-xdist a worker's prints are not shown; conftest.py prints these)."""
    REPORT.append(line)


def run_state() -> Path:
    """This run's shared folder (root only): what its pytest-xdist workers build once and share (users' passwords,
    the course), and each worker's timings and report lines. Keyed by the controlling pytest process."""
    owner = os.getppid() if os.environ.get("PYTEST_XDIST_WORKER") else os.getpid()
    folder = Path(f"/tmp/dtlabs-deploy-run-{owner}")
    folder.mkdir(mode=0o700, exist_ok=True)
    return folder


def once(name: str, make):
    """``make()`` once per run, whichever worker asks first (the others wait for it and get what it returned, as
    JSON: a failed command's result too, which each caller then asserts on). An exception is not kept: the next
    worker to ask tries again and fails with its own error."""
    state = run_state()
    with open(state / f"{name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = state / f"{name}.json"
        if done.is_file():
            return json.loads(done.read_text())
        value = make()
        tmp = done.with_suffix(".tmp")
        tmp.write_text(json.dumps(value))
        os.chmod(tmp, 0o600)
        tmp.replace(done)
        return value


def save_worker_report() -> None:
    """A worker's TIMINGS and REPORT, for the controlling process to print (conftest.py)."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "main")
    (run_state() / f"report-{name}.json").write_text(json.dumps({"timings": TIMINGS, "report": REPORT}))


def load_worker_reports() -> tuple[dict, list]:
    timings, lines = dict(TIMINGS), list(REPORT)
    for path in sorted(run_state().glob("report-gw*.json")):
        data = json.loads(path.read_text())
        timings.update(data["timings"])
        lines += data["report"]
    return timings, lines


def home(user: str) -> Path:
    return Path(pwd.getpwnam(user).pw_dir)


def user_env(user: str, **extra) -> dict:
    """What a login shell of ``user`` has, and no more (nothing of root's, no pyenv on PATH)."""
    env = {"HOME": str(home(user)), "USER": user, "LOGNAME": user, "SHELL": "/bin/bash", "LANG": "C.UTF-8",
           "PATH": "/usr/local/bin:/usr/bin:/bin"}
    for key in ("PIP_FIND_LINKS", "PIP_DEFAULT_TIMEOUT", "PIP_CERT", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL",
                "PIP_DISABLE_PIP_VERSION_CHECK"):
        if key in os.environ:
            env[key] = os.environ[key]
    env.update({k: str(v) for k, v in extra.items()})
    return env


def teacher_env(course: Path, **extra) -> dict:
    """The instructor's shell in their course: the course's config on the Jupyter path, the venv first on PATH."""
    return user_env(TEACHER, PATH=f"{course / '.venv' / 'bin'}:/usr/local/bin:/usr/bin:/bin",
                    JUPYTER_CONFIG_PATH=str(course / "grader"), **extra)


def _as_user(user: str, argv: list, env) -> list:
    """``argv`` run as ``user`` (runuser) with exactly ``env`` (default: ``user_env``)."""
    return ["runuser", "-u", user, "--", "env", "-i", *[f"{k}={v}" for k, v in (env or user_env(user)).items()], *argv]


def run_as(user: str, cmd, *, cwd=None, env=None, timeout=600, check=True, **kw) -> subprocess.CompletedProcess:
    """``cmd`` (a list, or a string for bash) as ``user`` through runuser, in ``cwd`` (default: their home)."""
    argv = ["bash", "-c", cmd] if isinstance(cmd, str) else list(map(str, cmd))
    res = subprocess.run(_as_user(user, argv, env), cwd=str(cwd or home(user)), capture_output=True, text=True,
                         timeout=timeout, **kw)
    if check and res.returncode != 0:
        shown = cmd if isinstance(cmd, str) else shlex.join(argv)
        raise AssertionError(f"as {user}: {shown}\nexit {res.returncode}\n--- stdout\n{res.stdout[-4000:]}\n"
                             f"--- stderr\n{res.stderr[-4000:]}")
    return res


def popen_as(user: str, cmd: str, *, cwd=None, env=None, **kw) -> subprocess.Popen:
    return subprocess.Popen(_as_user(user, ["bash", "-c", cmd], env), cwd=str(cwd or home(user)),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def ensure_users(passwords: dict) -> None:
    """The instructor and the students as ordinary Unix users (none of them root), each in the course's group."""
    for group in set(GROUPS.values()):
        subprocess.run(["groupadd", "-f", group], check=True)
    for user, group in GROUPS.items():
        try:
            pwd.getpwnam(user)
        except KeyError:
            subprocess.run(["useradd", "-m", "-s", "/bin/bash", "-G", group, user], check=True)
        subprocess.run(["usermod", "-aG", group, user], check=True)
        subprocess.run(["chpasswd"], input=f"{user}:{passwords[user]}\n", text=True, check=True)
        os.chmod(home(user), 0o750)  # no classmate reads another's home


def copy_course(dest: Path, owner: str) -> None:
    """The repository's tracked files (as a clone has them) into ``dest``, owned by ``owner``; an existing course
    venv there is kept, as an instructor's is between `git pull`s (``make install`` rebuilds it when needed)."""
    dest.mkdir(parents=True, exist_ok=True)
    for p in dest.iterdir():
        if p.name != ".venv":
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    tar = subprocess.Popen(["tar", "-cf", "-", "--null", "-T", "-"], cwd=REPO, stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE)
    untar = subprocess.Popen(["tar", "-xf", "-", "-C", str(dest)], stdin=tar.stdout)
    tar.stdin.write(files)
    tar.stdin.close()
    assert untar.wait() == 0 and tar.wait() == 0
    subprocess.run(["chown", "-R", f"{owner}:", str(dest)], check=True)


def processes_of(user: str) -> list:
    import psutil

    uid = pwd.getpwnam(user).pw_uid
    out = []
    for p in psutil.process_iter(["uids"]):
        try:
            if p.info["uids"] and p.info["uids"].real == uid:
                out.append(p)
        except Exception:  # noqa: BLE001 - a process that ended meanwhile
            pass
    return out


def kill_all_of(user: str, wait_s: float = 5.0) -> list[str]:
    """Kill whatever ``user`` (a test account) still runs; returns what was killed. Only the test's own users."""
    import psutil

    assert user in GROUPS, user
    procs = processes_of(user)
    killed = []
    for p in procs:
        try:
            killed.append(f"{p.pid} {p.name()}")
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=wait_s)
    return killed


def wait_for(predicate, timeout: float, what: str, poll: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
