"""Fixtures of the deployment tests: real users, the instructor's course in their home, a real Slurm, a real hub.

``make test-deploy`` installs what these need (``.ci/install-deploy``: Debian's slurm-wlm, munge, chromium,
bubblewrap, python3-venv) and runs them; the hub's environment (PyPI) and proxy (npm) are installed by
``grader/hub/hub.sh install`` here, beside the instructor's ``make install``. They skip, with
the reason, only where the machine cannot run them: not root (users cannot be created, daemons not started), or
the install step could not get what they need (it says why). Every daemon they start is stopped; every
process of the test users left at the end is killed and named.

``make test-deploy`` runs them on two pytest-xdist workers. One runs the tests that write the instructor's
course's gradebook: the hub's flow, then the Slurm grading array. The other runs the tests that do not: first
``train.sbatch`` (mostly waiting on torchrun's restart, while the first worker drives the hub, so Slurm's two CPUs are
free for it), then the layouts, each in its own copy. What both need (the users, the course's ``make install``, the
hub's environment, Slurm) is built once, by whichever worker asks first (``deploy_helpers.once``); the controlling
process prints every worker's timings and report lines and, when all are done, stops Slurm and kills what the test
users still run.
"""
from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from deploy_helpers import (
    COURSE_NAME, COURSE_PARENT, REPO, STUDENTS, SYSTEM_PYTHON, TEACHER, TIMINGS, TORCH_SPEC, copy_course, ensure_users,
    home, kill_all_of, load_worker_reports, once, report, run_as, run_state, save_worker_report,
)

HUB_PREFIX = Path(os.environ.get("DTLABS_HUB_PREFIX", "/opt/dtlabs"))


def pytest_collection_modifyitems(items):
    """On each worker, train.sbatch first: it must not meet the Slurm grading array (which runs last on the other)."""
    items.sort(key=lambda item: 0 if "train_sbatch" in item.name else 1)


_FINAL: dict = {}


def pytest_sessionfinish(session):
    """A worker hands its timings and report lines over; the controlling process (or a run without workers) gathers
    them and, everything being done, kills what the test users still run."""
    if hasattr(session.config, "workerinput"):
        save_worker_report()
        return
    state = run_state()
    _FINAL["timings"], _FINAL["report"] = load_worker_reports()
    if (state / "slurm.json").is_file():
        down = subprocess.run([str(SLURM_SCRIPT), "down"], capture_output=True, text=True, timeout=120)
        if down.returncode != 0:
            _FINAL["report"].append(f"[deploy] local-cluster.sh down failed: {down.stdout}{down.stderr}")
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if (state / "passwords.json").is_file():
        for user in (TEACHER, *STUDENTS):
            left = kill_all_of(user)
            if left:
                _FINAL["report"].append(f"[deploy] killed what {user} still ran at the end: {left}")
    shutil.rmtree(state, ignore_errors=True)


def pytest_terminal_summary(terminalreporter):
    timings, lines = _FINAL.get("timings") or TIMINGS, list(dict.fromkeys(_FINAL.get("report") or []))
    if lines:
        terminalreporter.section("what the deployment said")
        for line in lines:
            terminalreporter.write_line(line)
    if timings:
        terminalreporter.section("deployment timings (seconds) and scores")
        for what, value in timings.items():
            terminalreporter.write_line(f"{what}: {value:.1f}" if isinstance(value, float) else f"{what}: {value}")


def why_not_here() -> str:
    """'' when this machine can run the deployment tests, else the reason it cannot."""
    if os.geteuid() != 0:
        return "needs root: it creates Unix users and starts munged, slurmctld, slurmd and JupyterHub (run `make test-deploy` as root)"
    missing = [t for t in ("useradd", "runuser", "chpasswd") if not shutil.which(t)]
    if missing:
        return f"no {', '.join(missing)} on this machine: cannot create and switch to the course's users"
    if not Path(SYSTEM_PYTHON).is_file():
        return f"no {SYSTEM_PYTHON}: the course's users need a Python they can all run"
    return ""


@pytest.fixture(scope="session")
def passwords():
    """The course's users (an instructor, two students), created once per run; their passwords (for the hub)."""
    why = why_not_here()
    if why:
        pytest.skip(why)

    def make():
        pw = {u: secrets.token_urlsafe(12) for u in (TEACHER, *STUDENTS)}
        ensure_users(pw)
        return pw

    return once("passwords", make)  # what they still run at the end is killed by pytest_sessionfinish


class HubInstall(threading.Thread):
    """``grader/hub/hub.sh install`` (the hub's environment from PyPI, the proxy from npm) in the background: it
    runs beside the instructor's ``make install``, on the same two cores, instead of after it."""

    def __init__(self):
        super().__init__(daemon=True)
        self.result = None
        self.start()

    def run(self):
        def install():
            t0 = time.monotonic()
            res = subprocess.run([str(REPO / "grader" / "hub" / "hub.sh"), "install"], capture_output=True, text=True,
                                 timeout=1200, env={**os.environ, "TORCH_SPEC": TORCH_SPEC})
            out = "\n".join(line for line in (res.stdout + res.stderr).splitlines()
                            if not line.startswith("WARNING: Location"))
            return {"returncode": res.returncode, "output": out[-3000:], "seconds": time.monotonic() - t0}

        self.result = once("hub-install", install)  # one worker installs; the other finds it done

    def wait(self) -> None:
        self.join()
        TIMINGS["hub environment (hub.sh install, beside make install)"] = self.result["seconds"]
        assert self.result["returncode"] == 0, f"grader/hub/hub.sh install failed:\n{self.result['output']}"


@pytest.fixture(scope="session")
def hub_install(request, passwords):
    """Started by ``course`` when the session has hub tests; ``hub`` waits for it."""
    wanted = any("hub" in item.fixturenames for item in request.session.items)
    return HubInstall() if wanted else None


@pytest.fixture(scope="session")
def course(passwords, hub_install) -> Path:
    """The instructor's course: a copy of the repository (as a clone has it) under /tmp in a folder whose name has a
    space and a non-ASCII letter, owned by them, its own venv made by ``make install`` as them (Lab 10's frameworks
    left out: no deployment test uses them)."""
    dest = COURSE_PARENT / COURSE_NAME

    def make():
        # the instructor's folder starts empty: what an earlier run left in it may belong to a user since deleted and
        # made again under another uid (the builds and venvs the tests put beside the course are removed as them)
        shutil.rmtree(COURSE_PARENT, ignore_errors=True)
        COURSE_PARENT.mkdir()
        os.chmod(COURSE_PARENT, 0o755)
        shutil.chown(COURSE_PARENT, TEACHER)  # the instructor's folder: their other venvs and builds go beside it
        t0 = time.monotonic()
        copy_course(dest, TEACHER)
        run_as(TEACHER, ["make", "install", f"PYTHON={SYSTEM_PYTHON}", f"TORCH_SPEC={TORCH_SPEC}", "FRAMEWORKS=0"],
               cwd=dest, timeout=900)
        return time.monotonic() - t0

    TIMINGS["instructor's course: copy and make install"] = once("course", make)
    return dest


def _need(paths: dict) -> None:
    missing = [f"{what} ({path})" for what, path in paths.items() if not shutil.which(path) and not Path(path).exists()]
    if missing:
        pytest.skip("not installed: " + ", ".join(missing) + "; `make test-deploy` installs them (.ci/install-deploy) "
                    "and says why when it cannot")


SLURM_SCRIPT = REPO / "grader" / "slurm" / "local-cluster.sh"


@pytest.fixture(scope="session")
def slurm(passwords):
    """A single-node Slurm (grader/slurm/local-cluster.sh up), brought up once per run by the first worker that
    needs it, and stopped when the run ends (pytest_sessionfinish)."""
    _need({"slurmctld": "slurmctld", "slurmd": "slurmd", "munged": "munged", "sbatch": "sbatch"})

    def up():
        t0 = time.monotonic()
        res = subprocess.run([str(SLURM_SCRIPT), "up"], capture_output=True, text=True, timeout=180)
        return {"returncode": res.returncode, "output": (res.stdout + res.stderr).strip(), "seconds": time.monotonic() - t0}

    started = once("slurm", up)
    assert started["returncode"] == 0, started["output"]
    TIMINGS["Slurm up (local-cluster.sh up)"] = started["seconds"]
    report(f"[deploy] {started['output']}")
    return SLURM_SCRIPT


@pytest.fixture(scope="session")
def hub(passwords, course, hub_install):
    """JupyterHub with nbgrader's exchange (grader/hub/hub.sh up), the instructor owning the course; stopped at the end."""
    if not shutil.which("npm"):
        pytest.skip("no npm for configurable-http-proxy; `make test-deploy` installs it (.ci/install-deploy) and says "
                    "why when it cannot")
    hub_install.wait()
    script = REPO / "grader" / "hub" / "hub.sh"
    exchange = Path("/srv/dtlabs-test/exchange")  # the test's own, never a real course's /srv/nbgrader/exchange
    shutil.rmtree(exchange / "dtlabs", ignore_errors=True)  # a fresh course in the exchange every run
    for user in STUDENTS:  # and students who never took it (nbgrader's cache of their submissions included)
        for sub in ("01_ddp_setup", ".local/share/jupyter/nbgrader_cache", "concurrent.ipynb"):
            p = home(user) / sub
            shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)
    env = {**os.environ, "DTLABS_INSTRUCTOR": TEACHER, "DTLABS_HUB_PREFIX": str(HUB_PREFIX),
           "DTLABS_EXCHANGE": str(exchange)}
    t0 = time.monotonic()
    up = subprocess.run([str(script), "up"], capture_output=True, text=True, timeout=180, env=env)
    TIMINGS["hub up (hub.sh up)"] = time.monotonic() - t0
    assert up.returncode == 0, up.stdout + up.stderr
    report(f"[deploy] {up.stdout.strip()}")
    try:
        yield {"url": "http://127.0.0.1:8000", "exchange": exchange}
    finally:
        down = subprocess.run([str(script), "down"], capture_output=True, text=True, timeout=120, env=env)
        assert down.returncode == 0, down.stdout + down.stderr
