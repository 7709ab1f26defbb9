"""Nothing of a submission outlives it, and the course is closed as a whole (grader/README.md, "The boundary in each
mode"): processes that fork and exit every few milliseconds ("hoppers"), started inside a Landlock domain or not, are
gone after the separate user's kill and after an unprotected subject's end; what that user left in the world-writable
folders is removed, and nothing of anyone else's; the exposure check is an allow-list over the whole course.

The separate user's tests need root (they make the user where it is missing, as ``dtlabs doctor --grading --fix``
does) and a Python that user can run for its own processes (/usr/bin/python3); they skip with the reason elsewhere.
"""
from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil
import pytest

from lab_utils import processes
from lab_utils.grading.boundary import mounts, sandbox, separate_user, watchdog

SUBJECT = "dtlabs-subject"
# One worker for the whole file: every test is the separate user, and end_user on one worker SIGKILLed another
# worker's subject mid-test (a -n 2 run: "died with <Signals.SIGKILL: 9>", "the check could not run as ...")
pytestmark = pytest.mark.xdist_group("separate-user")
USER_PYTHON = "/usr/bin/python3"  # the grader's Python may lie where that user cannot go (a venv under /root)

# A hopper: a new session, then forks and exits in a tight loop, inside its own Landlock domain when asked (as the
# subject enters one); one of its processes is always alive, each for about a fork's time. It stops by itself after
# 180 s (past every test's timeout): a chain that a failing test, or a test run killed mid-way, left behind would
# otherwise hop on for good, re-parented to this machine's init, a core's worth of forks slowing all that follows.
HOPPER = r"""
import ctypes, os, sys, time
end = time.monotonic() + 180
if sys.argv[1] == "landlock":
    libc = ctypes.CDLL(None, use_errno=True)
    call = libc.syscall
    call.restype = ctypes.c_long
    abi = call(444, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    fields = [1 << 11, 0, 3] if abi >= 6 else [1 << 11]
    attr = (ctypes.c_uint64 * len(fields))(*fields)
    fd = call(444, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)), ctypes.c_uint32(0))
    assert fd >= 0 and libc.prctl(38, 1, 0, 0, 0) == 0 and call(446, ctypes.c_int(fd), ctypes.c_uint32(0)) == 0
os.setsid()
while time.monotonic() < end:
    if os.fork():
        os._exit(0)
"""

# The hoppers' parent: a subreaper that reaps, as the grader kernel adopts the orphans of a submission (else they
# would go to this machine's init, which may kill or never reap them).
NEST = r"""
import ctypes, json, os, subprocess, sys, time
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)
spec = json.loads(sys.argv[1])
for where in spec["where"]:
    subprocess.Popen([spec["python"], "-c", spec["hopper"], where, spec["token"]], cwd="/", env={},
                     **({"user": spec["uid"], "group": spec["gid"], "extra_groups": []} if spec["uid"] else {}))
print("started", flush=True)  # each Popen returned: every hopper runs its own program, as that user
while True:
    try:
        os.wait()
    except ChildProcessError:
        time.sleep(0.01)
"""


def _need_root_and_user():
    if os.geteuid() != 0:
        pytest.skip("the separate user needs a root grader")
    if not os.access(USER_PYTHON, os.X_OK):
        pytest.skip(f"no {USER_PYTHON} for the separate user's own processes")
    try:
        return pwd.getpwnam(SUBJECT)
    except KeyError:
        separate_user.fix(SUBJECT)
        return pwd.getpwnam(SUBJECT)


@pytest.fixture
def subject():
    entry = _need_root_and_user()
    separate_user.end_user(entry.pw_uid)  # nothing of an earlier test's
    yield entry
    separate_user.end_user(entry.pw_uid)


def _hoppers(below: int | None, token: str, for_s: float = 0.0) -> int:
    """The most hoppers (``token`` in their command line) seen running below ``below`` at once (None: anywhere on
    the machine, a chain re-parented to init included), looking for ``for_s`` (each lives about a fork's time: one
    look can miss a chain that lives on)."""
    most, end = 0, time.monotonic() + for_s
    while True:
        alive = 0
        for p in processes.descendants(below) if below else psutil.process_iter():
            try:
                if p.status() != psutil.STATUS_ZOMBIE and token in " ".join(p.cmdline()):
                    alive += 1
            except psutil.Error:
                continue
        most = max(most, alive)
        if time.monotonic() >= end:
            return most
        time.sleep(0.01)


def _carrying(token: str) -> list:
    """Every process with ``token`` in its command line, anywhere on the machine."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if token in " ".join(p.info["cmdline"] or ()):
            found.append(p)
    return found


def _start_hoppers(where, uid=None, gid=None, python=USER_PYTHON):
    """Hoppers under a reaping subreaper of root's (``NEST``); (the nest, their token), once they hop."""
    import json

    token = uuid.uuid4().hex
    spec = {"where": list(where), "python": python, "hopper": HOPPER, "uid": uid, "gid": gid, "token": token}
    nest = subprocess.Popen([sys.executable, "-c", NEST, json.dumps(spec)], start_new_session=True,
                            stdout=subprocess.PIPE, text=True)
    assert nest.stdout.readline().strip() == "started"
    assert _wait_for_hoppers(nest.pid, token, len(where))
    return nest, token


def _wait_for_hoppers(below: int, token: str, n: int) -> bool:
    deadline = time.monotonic() + 60  # a loaded machine starts Python slowly
    while _hoppers(below, token, for_s=0.5) < n:
        assert time.monotonic() < deadline, "the hoppers did not start"
    return True


def _stop(nest, token: str):
    """The nest, and every hopper of ``token`` wherever it went (a test that failed leaves hoppers that outlived
    their kill; re-parented to this machine's init they would hop on, a core's worth of forks, until their end)."""
    nest.kill()
    nest.wait()
    quiet, end = 0, time.monotonic() + 30
    while quiet < 50 and time.monotonic() < end:
        found = _carrying(token)
        for p in found:
            processes.kill_leader(p)  # its whole chain: the group outlives the hopper that made it
        quiet = 0 if found else quiet + 1


@pytest.mark.timeout(120)
def test_hoppers_of_the_separate_user_inside_and_outside_landlock_are_gone_after_its_kill(subject):
    """kill(-1) as that user until none of its processes runs: a kill from one snapshot of the processes left these
    hoppers alive, and they SIGKILLed the next student's subject (0/10 for an honest 7/10)."""
    nest, token = _start_hoppers(["landlock", "plain"], subject.pw_uid, subject.pw_gid)
    try:
        t0 = time.monotonic()
        separate_user.kill_user(subject.pw_uid)
        took = time.monotonic() - t0
        left = _hoppers(nest.pid, token, for_s=1.0)  # below the nest, a subreaper: the nest's own command line
        # holds the token too
        assert not left, f"{left} hopper(s) of {SUBJECT} survived its kill"
        assert took < 10, took
    finally:
        _stop(nest, token)


def _as_subject(entry, code: str) -> None:
    subprocess.run([USER_PYTHON, "-c", code], user=entry.pw_uid, group=entry.pw_gid, extra_groups=[], cwd="/",
                   check=True, env={}, timeout=30)


@pytest.mark.timeout(120)
def test_what_the_separate_user_left_in_every_world_writable_folder_is_removed_and_nothing_else(subject, tmp_path):
    """Dead drops: a file, a FIFO, a folder (one it closed to itself inside), a link to a root file and a System V
    segment the separate user left are gone after ``end_user``, in /tmp, /var/tmp, /dev/shm and /run/lock and in a
    world-writable folder inside /tmp; a root file and another user's beside them stay, and so does what the link
    pointed at."""
    folders = [f for f in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock") if os.path.isdir(f)]
    tag = uuid.uuid4().hex[:8]
    shared = Path(f"/tmp/dtlabs-test-shared-{tag}")  # another world-writable folder (as /tmp/.X11-unix)
    shared.mkdir()
    os.chmod(shared, 0o1777)
    target = Path(folders[0]) / f"dtlabs-test-root-{tag}"
    target.write_text("root's")
    kept = [target]
    other = pwd.getpwnam("nobody")
    for f in folders:
        mine, theirs = Path(f) / f"dtlabs-test-kept-{tag}", Path(f) / f"dtlabs-test-nobody-{tag}"
        mine.write_text("root's")
        theirs.write_text("nobody's")
        os.chown(theirs, other.pw_uid, other.pw_gid)
        kept += [mine, theirs]
    drops = [p for f in [*folders, str(shared)] for p in (f"{f}/drop-{tag}", f"{f}/fifo-{tag}", f"{f}/dir-{tag}",
                                                          f"{f}/link-{tag}")]
    try:
        _as_subject(subject, f"""
import ctypes, os
for f in {[*folders, str(shared)]!r}:
    open(f + "/drop-{tag}", "w").write("hidden tests")
    os.mkfifo(f + "/fifo-{tag}")
    os.makedirs(f + "/dir-{tag}/closed")
    open(f + "/dir-{tag}/closed/x", "w").write("x")
    os.chmod(f + "/dir-{tag}/closed", 0)
    os.symlink({str(target)!r}, f + "/link-{tag}")
libc = ctypes.CDLL(None, use_errno=True)
assert libc.shmget(0x5eed0000 + {int(tag[:4], 16)}, 4096, 0o1000 | 0o600) >= 0  # IPC_CREAT
""")
        assert all(os.path.lexists(p) for p in drops)
        separate_user.end_user(subject.pw_uid)
        assert [p for p in drops if os.path.lexists(p)] == []
        assert all(p.exists() for p in kept), [str(p) for p in kept if not p.exists()]
        assert target.read_text() == "root's"
        assert shared.is_dir()  # root's: only what that user owned in it went
        with open("/proc/sysvipc/shm") as fh:
            head, *rows = [line.split() for line in fh]
        assert not [r for r in rows if dict(zip(head, r))["uid"] == str(subject.pw_uid)]
    finally:
        for p in kept:
            p.unlink(missing_ok=True)
        shutil.rmtree(shared, ignore_errors=True)


def test_every_world_writable_mount_is_a_shared_folder(monkeypatch):
    """Besides the usual ones, any world-writable mount point counts (a tmpfs an image adds)."""
    found = separate_user.shared_folders()
    assert "/tmp" in found and all(os.stat(f).st_mode & stat.S_IWOTH for f in found)
    with open("/proc/self/mountinfo") as fh:
        points = [line.split()[4] for line in fh]
    for point in points:
        try:
            if os.stat(point).st_mode & stat.S_IWOTH and stat.S_ISDIR(os.stat(point).st_mode) \
                    and not point.startswith(("/proc/", "/sys/")):
                assert os.path.realpath(point) in found, point
        except OSError:
            continue


@pytest.fixture
def open_course(monkeypatch):
    """A course in a folder every user may pass through, open to others: ``.git``, ``labs/``, ``solutions/``,
    ``grader/``, a stray file, and a venv inside it (an installed path: the subject must read it)."""
    entry = _need_root_and_user()
    parent = Path(tempfile.mkdtemp(prefix="dtlabs-test-course-", dir="/tmp"))
    os.chmod(parent, 0o755)
    root = parent / "course"
    for d in (".git/objects", "labs/01", "solutions/01", "grader/work", ".venv/lib", "docs"):
        (root / d).mkdir(parents=True)
    for f in (".git/HEAD", "labs/01/a.ipynb", "solutions/01/a.ipynb", "grader/nbgrader_config.py", ".venv/lib/m.py",
              "Makefile", "secrets.txt"):
        (root / f).write_text("x")
    (root / "to-solutions").symlink_to(root / "solutions")
    for dirpath, dirs, files in os.walk(root):
        os.chmod(dirpath, 0o755)
        for f in files:
            os.chmod(os.path.join(dirpath, f), 0o644)
    real = mounts.installed_paths()
    monkeypatch.setattr(mounts, "installed_paths", lambda: [*real, str(root / ".venv")])
    if not os.access(sys.executable, os.X_OK) or "could not run" in " ".join(separate_user.exposure(SUBJECT)):
        monkeypatch.setattr(sys, "executable", USER_PYTHON)  # the check runs as that user, on a Python it can run
    monkeypatch.setattr(sandbox, "_checked", {})
    monkeypatch.setattr(sandbox, "_probe", lambda: (None, "no namespaces (test)"))
    monkeypatch.setenv("DTLABS_SUBJECT_USER", SUBJECT)
    yield entry, root
    shutil.rmtree(parent, ignore_errors=True)


def test_the_whole_course_but_the_venv_is_closed_to_the_separate_user_an_allow_list(open_course):
    """Every entry of the course is refused by name while open (``.git`` too: `git show HEAD:solutions/...` printed
    the hidden tests), ``--fix`` closes them, the venv inside stays readable and the check then passes."""
    entry, root = open_course
    with pytest.raises(sandbox.SandboxUnavailable) as refused:
        sandbox.require("user", course_root=root)
    said = str(refused.value)
    assert "could reach what a submission must not" in said, said
    for name in (".git", "labs", "solutions", "grader", "docs", "Makefile", "secrets.txt"):
        assert f"readable: {root / name}" in said, (name, said)
    assert f"listable: {root}" in said and f"readable: {root / '.venv'}" not in said, said
    done = separate_user.fix(SUBJECT, root)
    assert f"chmod o-rwx {root / '.git'}" in done and f"chmod o-rw {root}" in done, done
    assert os.path.islink(root / "to-solutions")  # never followed, never changed
    assert separate_user.exposure(SUBJECT, separate_user.course_paths(root)) == []
    sandbox._checked.clear()
    assert sandbox.require("user", course_root=root) == "user"
    subprocess.run([USER_PYTHON, "-c", f"open({str(root / '.venv' / 'lib' / 'm.py')!r}).read()"], user=entry.pw_uid,
                   group=entry.pw_gid, extra_groups=[], check=True, timeout=30)  # the venv: still readable
    (root / "added-later.txt").write_text("x")  # a new file is closed too, by the same rule
    os.chmod(root / "added-later.txt", 0o644)
    assert separate_user.exposure(SUBJECT, separate_user.course_paths(root)) == [
        f"readable: {root / 'added-later.txt'}"]


@pytest.mark.timeout(120)
@pytest.mark.filterwarnings("ignore:dtlabs. grading WITHOUT A BOUNDARY:RuntimeWarning")
@pytest.mark.parametrize("cgroup", [True, False], ids=["cgroup", "loop"])
def test_an_unprotected_subject_s_hoppers_are_gone_when_it_is_killed(tmp_path, monkeypatch, cgroup):
    """Unprotected (the grader's own user), the subject's hoppers (eight chains), in its Landlock domain, are gone after its box
    closes: killed with the subject's cgroup where one can be made here, else by a kill that loops until none is
    found below the grader (a subreaper, so they stay below it)."""
    if not cgroup:
        monkeypatch.setattr(watchdog.Cgroup, "make", classmethod(lambda cls, name: None))
    elif watchdog.Cgroup.make(f"dtlabs-test-{os.getpid()}") is None:
        pytest.skip("no cgroup v2 this process may make a child of here")
    else:
        watchdog.Cgroup(os.path.join(watchdog.own_cgroup(), f"dtlabs-test-{os.getpid()}")).remove()
    monkeypatch.setenv("DTLABS_SANDBOX", "unprotected")
    monkeypatch.setattr(sandbox, "_chosen", None)
    token = uuid.uuid4().hex
    starter = (f"import os, subprocess, sys, time\n"
               f"for where in ('landlock', 'plain') * 4:\n"
               f"    subprocess.Popen([sys.executable, '-c', {HOPPER!r}, where, {token!r}])\n"
               f"time.sleep(600)\n")
    workdir = tmp_path / "submission"
    workdir.mkdir()
    box = sandbox.start([sys.executable, "-c", starter], workdir)
    try:
        assert (box.cgroup is not None) == cgroup
        _wait_for_hoppers(os.getpid(), token, 8)  # the grader is their subreaper, as a grader kernel is
    finally:
        box.close()
    left = _hoppers(None, token, for_s=1.0)  # below this process or not: a chain that went to init counts
    if left:  # not left to the next test
        processes.kill_until_none(lambda: _carrying(token), "the hoppers")
    assert not left, f"{left} hopper(s) survived the subject"


@pytest.mark.timeout(120)
@pytest.mark.filterwarnings("ignore:dtlabs. grading WITHOUT A BOUNDARY:RuntimeWarning")
def test_a_process_that_appears_between_the_scan_and_the_kill_is_killed_too(tmp_path, monkeypatch):
    """What a hopper does, made certain: a process appears below the grader right after the kill's scan. A kill from
    one snapshot left it running; the kill loops until two scans find nothing. (No cgroup here: the loop alone.)"""
    monkeypatch.setattr(watchdog.Cgroup, "make", classmethod(lambda cls, name: None))
    monkeypatch.setenv("DTLABS_SANDBOX", "unprotected")
    monkeypatch.setattr(sandbox, "_chosen", None)
    token = uuid.uuid4().hex
    workdir = tmp_path / "submission"
    workdir.mkdir()
    box = sandbox.start([sys.executable, "-c", "import time; time.sleep(600)"], workdir)
    real_tree, late = processes.tree, []

    def scan_then_fork(pid, include_orphans=False):
        found = real_tree(pid, include_orphans)
        if not late:  # the scan is taken; now something forks, as a hopper does between a scan and its kill
            late.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", token]))
        return found

    box._stop.set()  # the watchdog's scans are not the kill's
    monkeypatch.setattr(processes, "tree", scan_then_fork)
    try:
        box.close()
    finally:
        monkeypatch.setattr(processes, "tree", real_tree)
        alive = late and late[0].poll() is None
        if alive:
            late[0].kill()
            late[0].wait()
    assert late and not alive, "a process that appeared after the kill's scan outlived the subject"


def _mq_open_in_child(limited: bool) -> int:
    """0 if a child (with the subject's limits when ``limited``) made a POSIX message queue, else its errno."""
    import ctypes

    name = f"/dtlabs-test-drop-{uuid.uuid4().hex[:8]}".encode()
    pid = os.fork()
    if pid == 0:
        code = 99
        try:
            if limited:
                watchdog.limit_resources(4096)
            rt = ctypes.CDLL("librt.so.1", use_errno=True)
            fd = rt.mq_open(name, os.O_CREAT | os.O_RDWR, 0o600, None)
            code = 0 if fd >= 0 else ctypes.get_errno()
            if fd >= 0:
                rt.mq_unlink(name)
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def test_a_subject_can_make_no_posix_message_queue():
    """A POSIX message queue outlives its maker, and where /dev/mqueue is not mounted nothing can list or remove it: a
    dead drop for the next submission of the same user. The subject's limits (every mode) allow none; the control,
    without them, makes one."""
    if not sys.platform.startswith("linux"):
        pytest.skip("POSIX message queues as Linux has them")
    assert _mq_open_in_child(limited=False) == 0, "this machine makes no message queue at all: the test proves nothing"
    assert _mq_open_in_child(limited=True) != 0
