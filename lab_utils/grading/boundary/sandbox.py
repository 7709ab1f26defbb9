"""The box a submission's code runs in while it is graded: bubblewrap, else a separate user, else refused.

Three modes (``mode()``), chosen by ``c.DTLabs.sandbox``:

- ``bwrap`` (Debian package ``bubblewrap``, where user namespaces work): the subject sees a root built from
  read-only binds of the system, the Python installation, the course venv and the ``lab_utils`` package, plus its
  own throwaway folder; nothing else of the course (``solutions/``, ``grader/``, the gradebook, other students)
  exists there. It gets a private ``/tmp``, its own PID, network (loopback only), IPC and UTS namespaces, no
  capabilities, a scrubbed environment, and it dies with its parent.
- ``user`` (the grader is root and bubblewrap cannot run: Docker's default seccomp profile, Gradescope's
  autograder images, many HPC containers): the subject runs as ``c.DTLabs.subject_user``, an unprivileged user
  with no other groups, in its own folder. Before anything is graded, ``require`` checks as that user that the
  course's answers and gradebooks are neither readable nor writable to it, and that the venv, the package and the
  course are not writable (``exposure``); a machine where they are refuses with the list. This is what
  PrairieLearn's and Otter's Gradescope graders rely on.
- ``unprotected`` (only by name: ``--unprotected``, ``c.DTLabs.sandbox = "unprotected"``): the grader's own user,
  its limits and the course guard only; every grade says it was taken without a boundary.

Where neither boundary can be had and none was named, ``require`` refuses with the reason: no grade without a
boundary. Every mode has the same watchdog (``watchdog``); the file system under bubblewrap is ``mounts``', the
separate user's checks ``separate_user``'s.
"""
from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import threading
import warnings
from functools import lru_cache
from pathlib import Path

from lab_utils import cgroups, processes, settings
from lab_utils.grading import outcomes
from lab_utils.grading.boundary import landlock, mounts, network, separate_user
from lab_utils.grading.boundary.watchdog import Box, Limits, limit_resources

# the variables a subject keeps; everything else (DTLABS_COURSE_ROOT, JUPYTER_*, tokens...) is dropped
KEEP_ENV = ("PATH", "LANG", "LC_ALL", "TZ", "OMP_NUM_THREADS", "OMP_WAIT_POLICY", "MKL_NUM_THREADS",
            "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "TORCH_SPEC",
            "DTLABS_TEST_TOKEN", "DTLABS_GRADING_TOKEN")  # random markers the leak checks count processes by
UNPROTECTED_WARNING = (
    "dtlabs: grading WITHOUT A BOUNDARY (--unprotected): submissions run as this user, with resource limits only. "
    "Their code can read what this user can read (the solutions included) and write what it can write; dtlabs grade "
    "puts back the course's grading files and stops if the venv changed, one submission at a time, and every grade "
    "says it was taken without a boundary. Install Debian's 'bubblewrap', or grade as root with a separate user "
    "(dtlabs doctor --grading --fix)."
)
UNPROTECTED = str(outcomes.UNPROTECTED)  # the grade's reason in that mode, as the subject's report writes it


class SandboxUnavailable(RuntimeError):
    """No boundary can be built here for the mode asked for: the reason, and how to get one."""


_chosen: str | None = None  # the course's c.DTLabs.sandbox, when the grader was told it (``require``)
_user: str | None = None  # the course's c.DTLabs.subject_user, likewise
_checked: dict = {}  # (mode, protected paths) -> None or the exposure found, once per process


def choose(dt) -> None:
    """Take the sandbox and separate user of a command's settings (``settings.DTLabs``), unchecked (``require``
    checks)."""
    global _chosen, _user
    _chosen, _user = dt.sandbox, dt.subject_user


def require(choice: str | None, course_root=None, protect=(), read_only=(), user: str | None = None) -> str:
    """Grade with ``choice`` ("auto", "bwrap", "user", "unprotected"/"off"; None: the setting in force) in this
    process and return the mode. Raises ``SandboxUnavailable`` with the reason where that boundary cannot be had,
    or where the separate user could read or write the course's answers (``course_root``, ``protect``), or write
    the venv, the package or ``read_only``."""
    global _chosen, _user
    _chosen, _user = choice, user
    now = mode()
    if now == "none":
        raise SandboxUnavailable(refusal())
    if now == "user":
        paths = tuple(str(p) for p in (*separate_user.course_paths(course_root), *protect))
        fixed = tuple(str(p) for p in read_only)
        key = (now, subject_user_name(), paths, fixed)
        if key not in _checked:
            _checked[key] = exposure(paths, fixed)
        if _checked[key]:
            raise SandboxUnavailable(
                f"the separate user {subject_user_name()!r} could reach what a submission must not: "
                + "; ".join(_checked[key]) + ". Fix: `dtlabs doctor --grading --fix` (as root), or chmod o-rwx the "
                "folders named readable and o-w those named writable")
    return now


def _in_force():
    """The settings in force where no command named the sandbox (``require(None)``): the environment's."""
    return settings.load()


def _choice() -> str:
    return _chosen or _in_force().sandbox


@lru_cache(maxsize=1)
def _probe() -> tuple[str | None, str | None]:
    """(bwrap's path, None) if bwrap can build a sandbox here, else (None, why not)."""
    path = shutil.which("bwrap")
    if not path:
        return None, "bwrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    probe = [path, "--ro-bind", "/", "/", "--unshare-pid", "--unshare-net", "--die-with-parent", "--proc", "/proc",
             "--dev", "/dev", "true"]
    try:
        run = subprocess.run(probe, capture_output=True, text=True, errors="replace", timeout=20)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"{path} could not run: {exc}"
    if run.returncode != 0:
        return None, (f"{path} cannot build a sandbox here ({run.stderr.strip()[:300] or f'exit {run.returncode}'}); "
                      "unprivileged user namespaces may be disabled (sysctl kernel.unprivileged_userns_clone, "
                      "user.max_user_namespaces) or a container forbids them")
    return path, None


def subject_user_name() -> str:
    return _user or _in_force().subject_user


def subject_user() -> tuple[pwd.struct_passwd | None, str | None]:
    """(the separate user's passwd entry, None) where submissions can run as it, else (None, why not)."""
    return separate_user.lookup(subject_user_name())


def fix(course_root=None) -> list[str]:
    """``dtlabs doctor --grading --fix`` (as root): the separate user in force created, the course closed to it."""
    _checked.clear()
    return separate_user.fix(subject_user_name(), course_root)


def exposure(protect=(), read_only=()) -> list[str]:
    """What of ``protect`` the separate user in force can reach, and what it could write (``separate_user.exposure``)."""
    return separate_user.exposure(subject_user_name(), protect, read_only)


def bwrap_path() -> str | None:
    """The bwrap binary if it can actually build a sandbox here (it cannot in some containers) and the course
    lets it be used (``c.DTLabs.sandbox`` "auto" or "bwrap")."""
    if _choice() not in ("auto", "bwrap"):
        return None
    return _probe()[0]


def probe_failure() -> str | None:
    """Why bubblewrap cannot be used here, or None when it can."""
    return _probe()[1]


def mode(choice: str | None = None) -> str:
    """'bwrap', 'user', 'unprotected', or 'none' (no boundary here and none named: ``refusal`` says why), for
    ``choice`` (default: the setting in force)."""
    choice = choice or _choice()
    if choice in ("off", "unprotected"):
        return "unprotected"
    if choice in ("auto", "bwrap") and _probe()[0]:
        return "bwrap"
    if choice in ("auto", "user") and subject_user()[0] is not None:
        return "user"
    return "none"


def refusal() -> str:
    """Why no boundary can be had here, and what to do."""
    choice = _choice()
    why = []
    if choice in ("auto", "bwrap"):
        why.append(f"bubblewrap: {probe_failure() or 'it runs here'}")
    if choice in ("auto", "user"):
        why.append(f"separate user: {subject_user()[1]}")
    return ("no boundary between a submission and this machine can be built here (c.DTLabs.sandbox = "
            f"{choice!r}): " + "; ".join(why) + ". Grade as root with a separate user (`dtlabs doctor --grading "
            "--fix`), on a machine where bubblewrap runs, or, knowing every grade is then taken without a boundary, "
            "with --unprotected")


_warned = False


def warn_unprotected_once() -> None:
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(UNPROTECTED_WARNING, RuntimeWarning, stacklevel=2)


def shared_tmp(workdir) -> Path:
    """The temp folder the grader and the subject share (the grader's tempfile points there while grading), so a
    course cell's temp files (a checkpoint the ranks write, the test reads) are the same files on both sides."""
    return Path(workdir) / ".tmp"


def _env(home: str, extra: dict) -> dict:
    env = processes.share_cores({k: os.environ[k] for k in KEEP_ENV if k in os.environ})  # beside its kernel
    # the CPU budget measured here: inside bubblewrap /sys/fs/cgroup is not there to read (its ranks' threads)
    env[cgroups.BUDGET_ENV] = str(cgroups.cpu_budget().cpus)
    env.update(HOME=home, TMPDIR=str(shared_tmp(home)), PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1",
               MPLBACKEND="module://matplotlib_inline.backend_inline", MPLCONFIGDIR=os.path.join(home, ".mpl"),
               PYDEVD_DISABLE_FILE_VALIDATION="1",
               # c10d warns on every connection that it cannot name the peer inside a fresh network namespace
               TORCH_CPP_LOG_LEVEL="ERROR")
    env.update(extra)
    return env


def describe_mounts(workdir, limits: Limits | None = None) -> str:
    """The subject's file system in words (``dtlabs doctor --grading``)."""
    return "\n".join(f"  {m.kind:8s} {m.dest}" + (f" -> {m.src}" if m.kind == "symlink" else "")
                     for m in mounts.mounts(workdir, tmp_mb=(limits or Limits()).disk_mb))


def sockets_folder(workdir) -> Path:
    """Where the grader makes the sockets the subject must reach (the relay of counted launches, a counted lock):
    beside the submission's folder, the grader's, so the subject can connect but neither write there nor put a link
    or a socket of its own in their place. As the separate user it is the grader's, in that user's group, setgid
    (2750: sockets made there are 0660 and that group's, ``sockets.socket_mode``); otherwise 0700, and under bubblewrap
    bound read-only at the same path."""
    workdir = Path(workdir).resolve()
    return workdir.with_name(workdir.name + ".sockets")


def _private_package(workdir) -> Path:
    """The subject's private copy of ``lab_utils`` outside bubblewrap: beside the submission's folder, the grader's
    and read-only to the subject, so nothing the submission shipped (a ``sitecustomize.py``, a ``torch.py``) can sit
    on the path it starts with."""
    workdir = Path(workdir)
    return workdir.with_name(workdir.name + ".pkg")


def _grader_folder(path: Path, mode: int, group: int | None = None) -> None:
    """``path`` made anew as this process's, with ``mode`` and, where given, ``group``: one of ours already there (a
    subject started again in the same folder) is replaced; anything else there is refused, never taken over."""
    try:
        there = os.lstat(path)
    except FileNotFoundError:
        there = None
    if there is not None and stat.S_ISDIR(there.st_mode) and there.st_uid == os.geteuid():
        shutil.rmtree(path)
    os.mkdir(path, 0o700)
    if group is not None:
        os.chown(path, -1, group)
    os.chmod(path, mode)


def command(argv: list[str], workdir: Path, env: dict, limits: Limits | None = None) -> tuple[list[str], dict, str | None]:
    """(argv to run, environment, cwd) for ``argv`` boxed with bwrap, or prepared to run as the separate user or
    (unprotected) as this one: then in the submission's folder, with a private copy of the package first on its
    path (``DTLABS_SUBJECT_PKG``, for a subject started with ``-I``; ``PYTHONPATH``, for what it starts), so
    ``lab_utils.__file__`` leads nowhere near the course. Makes ``sockets_folder(workdir)``."""
    workdir = Path(workdir).resolve()
    mounts.prepare_home(workdir)
    shared_tmp(workdir).mkdir(exist_ok=True)
    bwrap = bwrap_path()
    box_mode = "bwrap" if bwrap else mode()
    user = subject_user()[0] if box_mode == "user" else None
    sockets = sockets_folder(workdir)
    _grader_folder(sockets, 0o2750 if user else 0o700, user.pw_gid if user else None)
    if bwrap:
        inside = str(workdir)  # the same path on both sides, so paths in the shared temp folder mean the same file
        cmd = [bwrap, "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-net", "--unshare-ipc",
               "--unshare-uts", "--unshare-cgroup-try", "--cap-drop", "ALL",
               "--clearenv"]
        for step in mounts.mounts(workdir, tmp_mb=(limits or Limits()).disk_mb, sockets=str(sockets)):
            cmd += step.args()
        cmd += ["--chdir", inside]
        for k, v in _env(inside, env).items():
            cmd += ["--setenv", k, v]
        return cmd + ["--"] + argv, {}, None
    # a private copy of lab_utils first on the path: lab_utils.__file__ then leads nowhere near the course
    private = _private_package(workdir)
    _grader_folder(private, 0o755)
    shutil.copytree(mounts.PKG_DIR, private / "lab_utils", ignore=shutil.ignore_patterns("__pycache__"))
    if user:
        separate_user.hand_over(workdir, subject_user_name())
    else:
        warn_unprotected_once()
    return argv, _env(str(workdir), {**env, "PYTHONPATH": str(private), "DTLABS_SUBJECT_PKG": str(private),
                                     "PYTHONNOUSERSITE": "1"}), str(workdir)


def _enter_boundary(memory_mb: int, landlocked: bool) -> None:  # runs in the child between fork and exec
    """The child's limits, and outside bubblewrap its Landlock domain: entered here, after the uid change and before
    ``exec``, so the subject's interpreter starts bound, every thread it will ever have included (a domain binds the
    thread that enters it and what it starts; exec keeps it). Under bubblewrap the subject enters one itself (a
    domain here would keep bwrap from mounting)."""
    limit_resources(memory_mb)
    if landlocked:
        landlock.scope_self()


def start(argv: list[str], workdir: Path, *, env: dict | None = None, pass_fds=(), limits: Limits | None = None,
          stdout=None, count_caller: bool = False) -> Box:
    """Start ``argv`` in a sandbox around ``workdir``; returns the running ``Box`` with its watchdog.
    ``count_caller``: this process's memory growth from now on counts against the submission's memory limit."""
    limits = limits or Limits()
    cmd, full_env, cwd = command(argv, workdir, env or {}, limits)
    box_mode = mode()
    if box_mode != "bwrap":
        processes.become_subreaper()  # orphans of the submission come back to us, so they can be found
        landlock.abi()  # the C library opened here, not in the child (_enter_boundary)
    as_user, lock = {}, None
    if box_mode == "user":  # no supplementary groups: the subject is its own user and group, nothing more
        entry = subject_user()[0]
        as_user = dict(user=entry.pw_uid, group=entry.pw_gid, extra_groups=[])
        lock = separate_user.one_subject_at_a_time(entry.pw_uid)
        network.for_grading(entry.pw_uid)  # all but loopback closed to it, once per process (else the grade says so)
    popen = subprocess.Popen(
        cmd, env=full_env, cwd=cwd, pass_fds=tuple(pass_fds), stdin=subprocess.DEVNULL, stdout=stdout,
        stderr=subprocess.STDOUT, start_new_session=True,
        preexec_fn=lambda: _enter_boundary(limits.memory_mb, landlocked=box_mode != "bwrap"),
        **as_user,
    )
    import psutil

    box = Box(popen, box_mode, limits, caller_baseline=psutil.Process().memory_info().rss if count_caller else None,
              workdir=Path(workdir), lock=lock, uid=as_user.get("user"))
    threading.Thread(target=box._watch, daemon=True, name="dtlabs-sandbox-watchdog").start()
    return box
