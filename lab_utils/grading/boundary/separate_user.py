"""The separate user, the boundary where bubblewrap cannot run and the grader is root: an unprivileged user with no
other groups (``c.DTLabs.subject_user``) runs each submission in a folder handed over to it, one submission at a
time per machine, and nothing of it outlives the submission: its processes are killed until none runs and what it
left in the world-writable folders is removed (``end_user``). ``exposure`` asks that user itself whether the course
is closed to it but for what a subject must read (``course_paths``, an allow-list) and what every later grading runs
is unwritable to it; ``fix`` makes it so (``dtlabs doctor --grading --fix``). This is what PrairieLearn's and Otter's Gradescope graders rely on."""
from __future__ import annotations

import contextlib
import ctypes
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import time
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
    import tempfile

    here = Path(tempfile.gettempdir()).resolve()
    if all(p.stat().st_mode & stat.S_IXOTH for p in (here, *here.parents)):
        return None
    return "/tmp"


def course_paths(course_root) -> list[str]:
    """What of a course the separate user must not reach, as an allow-list: every entry of the course (``.git``,
    ``labs/``, ``solutions/``, ``grader/``, a stray file, one added later) is closed to it (neither readable, writable
    nor traversable) but what a subject must read, the installed paths inside the course (``mounts.installed_paths``:
    the venv, the package), and the folders on the way to those, listed with a trailing slash: those it may pass
    through, but neither list nor write. Links are left out (what one leads to is judged where it lies)."""
    if not course_root:
        return []
    root = os.path.realpath(course_root)
    inside = [p for p in mounts.installed_paths() if p != root and mounts.within(p, root)]
    closed, passages = [], [root]
    for folder in passages:  # grows while walked: the folders on the way to an installed path
        passages_here = {os.path.join(folder, os.path.relpath(p, folder).split(os.sep)[0]) for p in inside
                         if p != folder and mounts.within(p, folder)}
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            if entry.is_symlink() or entry.path in inside:
                continue
            if entry.path in passages_here and entry.is_dir(follow_symlinks=False):
                passages.append(entry.path)
            else:
                closed.append(entry.path)
    return [os.path.join(p, "") for p in passages] + closed


def _passage(path: str) -> bool:
    return path.endswith("/") and path != "/"


EXPOSURE_CHECK = """
import json, os, sys
protect, read_only = json.loads(sys.argv[1])
found = []
for p in protect:
    passage = p.endswith("/") and p != "/"  # a folder on the way to what the subject reads: it may pass, no more
    if passage:
        p = p.rstrip("/")
    if not os.path.lexists(p):
        continue
    if passage and os.access(p, os.R_OK):
        found.append("listable: " + p)
    elif not passage and (os.access(p, os.R_OK) or (os.path.isdir(p) and os.access(p, os.X_OK))):
        found.append("readable: " + p)
    if os.access(p, os.W_OK):
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
    return mounts.installed_paths() + sorted({str(Path(p).parent) for p in protect if not _passage(p)})


def fix(name: str, course_root=None) -> list[str]:
    """``dtlabs doctor --grading --fix`` (as root): create the separate user if missing, close the course to others
    (``course_paths``: every entry o-rwx, the folders on the way to the venv o-rw) and make what it may only read
    unwritable to others. Never through a link. Returns what it did."""
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
    steps = [(p.rstrip("/"), 0o006) if _passage(p) else (p, 0o007) for p in closed]
    steps += [(p, 0o002) for p in unwritable(closed) if os.path.isdir(p)]
    for path, drop in steps:
        try:
            st = os.lstat(path)
        except OSError:
            continue
        mode_now = stat.S_IMODE(st.st_mode)
        if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)) or not mode_now & drop:
            continue  # a link (never followed), a FIFO or a device: not opened
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            if os.fstat(fd).st_ino != st.st_ino:
                continue  # replaced since it was looked at
            os.fchmod(fd, mode_now & ~drop)
        finally:
            os.close(fd)
        done.append(f"chmod o-{''.join(c for c, bit in zip('rwx', (4, 2, 1)) if drop & bit)} {path}")
    return done or ["nothing to fix"]


def exposure(name: str, protect=(), read_only=()) -> list[str]:
    """Asked as the separate user itself (``os.access`` in a process of its own, with no other groups): which of
    ``protect`` it can read or write (a folder listed with a trailing slash: list or write), and which installed folder (``installed_paths``) or course folder it can write.
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


SHARED_FOLDERS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/dev/mqueue")  # where any user may leave a file


def shared_folders() -> list[str]:
    """Every folder where one submission could leave something for a later one: the usual world-writable ones, the
    temp folder, and every other mount point that is world-writable (a tmpfs, say); links resolved, each once."""
    import tempfile

    found = [*SHARED_FOLDERS, tempfile.gettempdir()]
    try:
        with open("/proc/self/mountinfo") as fh:  # field 5: the mount point, with octal escapes (\040 a space)
            found += [line.split()[4].encode().decode("unicode_escape") for line in fh]
    except OSError:
        pass
    out = {}
    for path in found:
        real = os.path.realpath(path)
        try:
            st = os.stat(real)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_IWOTH and not real.startswith(("/proc/", "/sys/")):
            out[real] = None
    return list(out)


def _alive_of(uid: int) -> list[str]:
    """Processes but this one that a process of ``uid`` may signal (real or saved uid ``uid``) and that still run
    (a zombie runs nothing and forks nothing; its parent reaps it)."""
    alive, me = [], str(os.getpid())
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or pid == me:
            continue
        try:
            with open(f"/proc/{pid}/status") as fh:
                fields = dict(line.split(":", 1) for line in fh.read().splitlines() if ":" in line)
        except (OSError, ValueError):
            continue  # gone
        ruid, _, suid = fields.get("Uid", "x x x").split()[:3]
        if str(uid) in (ruid, suid) and fields.get("State", "Z").split()[0] not in ("Z", "X"):
            alive.append(f"{pid} {fields.get('Name', '?').strip()}")
    return alive


def _remove_owned(folders) -> list[str]:
    """Remove every entry this process's user owns in ``folders`` and in the world-writable folders inside them
    (``/tmp/.X11-unix``); what it could not remove. Runs as that user (``_as_user``): nothing is removed with more
    rights than it had, and no link is followed (``rmtree`` works on file descriptors)."""
    me, left, todo = os.getuid(), [], [(f, 0) for f in folders]

    def opened(func, path, exc):  # a folder it closed to itself (mode 000): it owns it, so it may open it again
        try:
            os.chmod(path, 0o700)
            shutil.rmtree(path) if func is not os.unlink else func(path)
        except OSError:
            pass

    while todo:
        folder, depth = todo.pop()
        try:
            with os.scandir(folder) as it:
                entries = list(it)
        except OSError:
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if st.st_uid == me:
                with contextlib.suppress(OSError):
                    shutil.rmtree(entry.path, onerror=opened) if stat.S_ISDIR(st.st_mode) else os.unlink(entry.path)
                if os.path.lexists(entry.path):
                    left.append(entry.path)
            elif stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_IWOTH and depth < 8:
                todo.append((entry.path, depth + 1))
    return left


def _remove_ipc() -> list[str]:
    """Remove the System V shared memory, message queues and semaphores this process's user owns or created: they
    outlive their processes, a drop box for the next submission like a file."""
    libc = processes.libc()
    rmid = {"shm": lambda i: libc.shmctl(i, 0, None), "msg": lambda i: libc.msgctl(i, 0, None),
            "sem": lambda i: libc.semctl(i, 0, 0)}  # IPC_RMID is 0
    me, left = str(os.getuid()), []
    for kind, remove in rmid.items():
        try:
            with open(f"/proc/sysvipc/{kind}") as fh:
                head, *rows = [line.split() for line in fh]
        except (OSError, ValueError):
            continue
        for row in rows:
            info = dict(zip(head, row))
            if me in (info.get("uid"), info.get("cuid")) and remove(ctypes.c_int(int(row[1]))) != 0:
                left.append(f"System V {kind} {row[1]}")
    return left


def _end_everything(folders, deadline: float) -> dict:
    """Runs as the separate user: ``kill(-1, SIGKILL)`` (every process of that user but this one, in one step no
    fork escapes) until none of them runs, then, with nothing left to race it, remove what it left (``folders``:
    files; None: none of it)."""
    while True:
        with contextlib.suppress(ProcessLookupError):
            os.kill(-1, signal.SIGKILL)
        alive = _alive_of(os.getuid())
        if not alive:
            break
        if time.monotonic() > deadline:
            return {"alive": alive[:20], "left": []}
        time.sleep(0.005)
    return {"alive": [], "left": [] if folders is None else (_remove_owned(folders) + _remove_ipc())[:20]}


def _as_user(entry: pwd.struct_passwd, task, *args, timeout_s: float):
    """``task(*args)`` in a child of this process that has become ``entry``'s user (no other groups); what it returned
    (JSON), or None if it did not finish (killed, or past ``timeout_s``). A fork, not a program: this Python need not
    be runnable by that user. The uid change makes the child undumpable, so no process of that user can trace it or
    read the memory it shares with the grader."""
    import json

    processes.libc()  # opened here, not in the child
    r, w = os.pipe()

    def child():
        os.setgroups([])
        os.setgid(entry.pw_gid)
        os.setuid(entry.pw_uid)
        os.write(w, json.dumps(task(*args)).encode())  # a few lines: the pipe holds them until read

    helper = processes.ForkedChild(child)
    os.close(w)
    try:
        helper.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        helper.send_signal(signal.SIGKILL)
        helper.wait()
    os.set_blocking(r, False)
    try:
        return json.loads(os.read(r, 1 << 16))
    except (OSError, ValueError):
        return None
    finally:
        os.close(r)


def end_user(uid: int, clean: bool = True, deadline_s: float = 10.0, clean_s: float = 120.0) -> None:
    """Nothing of the separate user outlives a submission: every process it runs is killed (``kill(-1)`` as that
    user, until none runs: processes that fork and exit every few milliseconds outlived every kill from a snapshot
    and signalled the next subject), and with ``clean`` everything it owns in every world-writable folder is removed
    (``shared_folders``; a drop box for the next submission) with its System V IPC objects. Raises RuntimeError with
    the reason where that cannot be done in time: the next subject must not start then."""
    entry = pwd.getpwuid(uid)
    folders = shared_folders() if clean else None
    deadline = time.monotonic() + deadline_s
    while True:  # a helper killed by what it was killing (the same user may signal it) is started again
        done = _as_user(entry, _end_everything, folders, deadline, timeout_s=deadline_s + (clean_s if clean else 0))
        if done is not None and not done["alive"]:
            break
        if time.monotonic() > deadline:
            running = "; ".join((done or {}).get("alive", [])[:5]) or "its helper was killed each time"
            raise RuntimeError(f"the processes of {entry.pw_name!r} could not all be killed in {deadline_s:g} s "
                               f"({running})")
    if done["left"]:
        raise RuntimeError(f"{entry.pw_name!r} left what it could not remove: " + "; ".join(done["left"][:5]))


def kill_user(uid: int) -> None:
    """Every process of the separate user killed, until none runs (``end_user`` without the files)."""
    end_user(uid, clean=False)


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
    crashed grading left running as that user is killed, and what it left in the world-writable folders removed
    (``end_user``), before the next starts."""
    import fcntl

    path = f"/run/lock/dtlabs-subject-{uid}.lock" if os.path.isdir("/run/lock") else f"/tmp/dtlabs-subject-{uid}.lock"
    fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW, 0o600)
    try:
        if os.fstat(fd).st_uid != os.geteuid():  # the user's own would go with what it left (end_user): no lock
            raise RuntimeError(f"{path} is not the grader's: remove it, no grading is running as that user")
        fcntl.flock(fd, fcntl.LOCK_EX)
        end_user(uid)
    except BaseException:
        os.close(fd)
        raise
    remove_stale_work_roots()
    return fd
