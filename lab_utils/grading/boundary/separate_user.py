"""The separate user, the boundary where bubblewrap cannot run and the grader is root: an unprivileged user with no
other groups (``c.DTLabs.subject_user``) runs each submission in a folder handed over to it, one submission at a
time per machine, and what it leaves running is killed. ``exposure`` asks that user itself whether the course's
answers and gradebooks are closed to it and what every later grading runs is unwritable to it; ``fix`` makes it so
(``dtlabs doctor --grading --fix``). This is what PrairieLearn's and Otter's Gradescope graders rely on."""
from __future__ import annotations

import os
import pwd
import subprocess
import sys
from pathlib import Path

from lab_utils import processes, tempdirs
from lab_utils.grading.boundary import mounts


def lookup(name: str) -> tuple[pwd.struct_passwd | None, str | None]:
    """(the passwd entry of the separate user ``name``, None) where submissions can run as it, else (None, why
    not)."""
    if os.geteuid() != 0:
        return None, "the grader is not root, so it cannot run a submission as a separate user"
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return None, (f"the user {name!r} does not exist (create it: `dtlabs doctor --grading --fix`, or "
                      f"useradd --system --user-group --no-create-home --shell /usr/sbin/nologin {name})")
    if entry.pw_uid == 0 or entry.pw_gid == 0:
        return None, f"the user {name!r} is root or in root's group: it must be an unprivileged user"
    return entry, None


def subjects_folder() -> str | None:
    """Where the separate user's folders go: the temp folder if every folder above it lets others pass, else /tmp
    (a TMPDIR inside a private folder would keep the subject from its own files)."""
    import stat
    import tempfile

    here = Path(tempfile.gettempdir()).resolve()
    if all(p.stat().st_mode & stat.S_IXOTH for p in (here, *here.parents)):
        return None
    return "/tmp"


def course_paths(course_root) -> list[str]:
    """What of a course the separate user must not read: its answers, config and gradebooks."""
    if not course_root:
        return []
    root = Path(course_root)
    return [str(root / "solutions"), str(root / "grader")]


EXPOSURE_CHECK = """
import json, os, sys
protect, read_only = json.loads(sys.argv[1])
found = []
for p in protect:
    if os.path.lexists(p) and (os.access(p, os.R_OK) or (os.path.isdir(p) and os.access(p, os.X_OK))):
        found.append("readable: " + p)
    if os.path.lexists(p) and os.access(p, os.W_OK):
        found.append("writable: " + p)
for p in read_only:
    if os.path.lexists(p) and os.access(p, os.W_OK):
        found.append("writable: " + p)
print(json.dumps(found))
"""


def unwritable(protect) -> list[str]:
    """What the separate user must not write besides ``protect``: what every later grading runs
    (``mounts.installed_paths``) and the folders holding ``protect`` (the course itself: no submission adds a file
    to it). ``fix`` makes them so, ``exposure`` checks them."""
    return mounts.installed_paths() + sorted({str(Path(p).parent) for p in protect})


def fix(name: str, course_root=None) -> list[str]:
    """``dtlabs doctor --grading --fix`` (as root): create the separate user if missing, close the course's answers
    and gradebooks to others and make what it may only read unwritable to others. Returns what it did."""
    import stat

    if os.geteuid() != 0:
        return ["nothing fixed: only root can create the separate user (run it with sudo)"]
    done = []
    try:
        pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
                        "--shell", "/usr/sbin/nologin", name], check=True, capture_output=True)
        done.append(f"created the user {name!r}")
    closed = course_paths(course_root)
    for path, drop in [*((p, 0o007) for p in closed), *((p, 0o002) for p in unwritable(closed))]:
        if os.path.isdir(path) and not os.path.islink(path):
            mode_now = stat.S_IMODE(os.stat(path).st_mode)
            if mode_now & drop:
                os.chmod(path, mode_now & ~drop)
                done.append(f"chmod o-{'rwx' if drop == 0o007 else 'w'} {path}")
    return done or ["nothing to fix"]


def exposure(name: str, protect=(), read_only=()) -> list[str]:
    """Asked as the separate user itself (``os.access`` in a process of its own, with no other groups): which of
    ``protect`` it can read or write, and which installed folder (``installed_paths``) or course folder it can write.
    Empty: the boundary holds."""
    import json

    entry, why = lookup(name)
    if entry is None:
        return [why]
    try:
        run = subprocess.run(
            [sys.executable, "-I", "-S", "-c", EXPOSURE_CHECK,
             json.dumps([list(protect), unwritable(protect) + list(read_only)])],
            user=entry.pw_uid, group=entry.pw_gid, extra_groups=[], cwd="/", capture_output=True, text=True, timeout=60,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    except OSError as exc:  # this Python lies where that user cannot go (a venv made from a Python under /root)
        return [f"the check could not run as {entry.pw_name!r}: {sys.executable}: {exc.strerror}"]
    if run.returncode != 0:
        return [f"the check could not run as {entry.pw_name!r}: {run.stderr.strip()[-300:]}"]
    return json.loads(run.stdout)


def hand_over(workdir: Path, name: str) -> None:
    """Make the submission's folder the separate user's: owned by it, shared with the grader through its group
    (setgid folders, so what the grader's kernel writes there, a checkpoint or the relay's socket, stays the
    subject's to use: ``start_grading`` sets that kernel's umask to 002), closed to everyone else."""
    entry, why = lookup(name)
    if entry is None:
        raise PermissionError(why)
    for folder, dirs, files in os.walk(workdir):
        os.lchown(folder, entry.pw_uid, entry.pw_gid)
        os.chmod(folder, 0o2770)
        for name in files:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                os.lchown(path, entry.pw_uid, entry.pw_gid)
                os.chmod(path, 0o660 | (os.stat(path).st_mode & 0o110))


def kill_user(uid: int) -> None:
    import psutil

    processes.kill_procs([p for p in psutil.process_iter(["uids"]) if p.info["uids"] and p.info["uids"].real == uid])


WORK_ROOT_PREFIX = "dtlabs-subjects-"


def make_work_root(user_mode: bool) -> str:
    """A grading's folder for its subjects' folders (``tempdirs.owned_tempdir``): removed when the grading ends, or,
    where the grading was killed first, by the next one on the machine (``remove_stale_work_roots``). The separate
    user passes through it (0711) to its own folder, no more."""
    root = tempdirs.owned_tempdir(WORK_ROOT_PREFIX, dir=subjects_folder() if user_mode else None)
    if user_mode:
        os.chmod(root, 0o711)
    return root


def remove_stale_work_roots() -> list[str]:
    """Remove the subject folders of gradings that were killed before they could: a student's files, the separate
    user's, would otherwise stay in the temp folder for good (closed to listing, so no later submission can find
    them, but kept past the grading that needed them). Never a live grading's (one waiting for the lock)."""
    import tempfile

    return tempdirs.remove_orphaned_tempdirs(WORK_ROOT_PREFIX, [tempfile.gettempdir(), "/tmp"])


def one_subject_at_a_time(uid: int) -> int:
    """Two subjects of one user could signal, trace or read each other's processes: on a machine, the separate user
    runs one submission at a time (``dtlabs grade --jobs`` and concurrent ``grade-one`` tasks wait here), and what a
    crashed grading left running as that user is killed, and what it left in the temp folder removed, before the next
    starts."""
    import fcntl

    fd = os.open(f"/run/lock/dtlabs-subject-{uid}.lock" if os.path.isdir("/run/lock") else
                 f"/tmp/dtlabs-subject-{uid}.lock", os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    kill_user(uid)
    remove_stale_work_roots()
    return fd
