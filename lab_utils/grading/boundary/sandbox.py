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
boundary. Every mode has the same watchdog: memory (total RSS of the submission's processes), process-count and
disk limits, and the reason it stopped the box, so a grade can say "memory limit" instead of "dead kernel".
"""
from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import threading
import warnings
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from lab_utils import processes, settings
from lab_utils.grading import outcomes

PKG_DIR = processes.PACKAGE_DIR
# the variables a subject keeps; everything else (DTLABS_COURSE_ROOT, JUPYTER_*, tokens...) is dropped
KEEP_ENV = ("PATH", "LANG", "LC_ALL", "TZ", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES",
            "NVIDIA_VISIBLE_DEVICES", "TORCH_SPEC",
            "DTLABS_TEST_TOKEN", "DTLABS_GRADING_TOKEN")  # random markers the leak checks count processes by
UNPROTECTED_WARNING = (
    "dtlabs: grading WITHOUT A BOUNDARY (--unprotected): submissions run as this user, with resource limits only. "
    "Their code can read what this user can read (the solutions included) and write what it can write; dtlabs grade "
    "puts back the course's grading files and stops if the venv changed, one submission at a time, and every grade "
    "says it was taken without a boundary. Install Debian's 'bubblewrap', or grade as root with a separate user "
    "(dtlabs doctor --grading --fix)."
)
UNPROTECTED = str(outcomes.UNPROTECTED)  # the grade's reason in that mode, as the subject's report writes it


@dataclass
class Limits:
    """What one submission may use (``c.DTLabs.memory_mb`` / ``max_procs`` / ``disk_mb``; ``of`` takes them from a
    command's settings, the defaults are the settings' own). ``memory_mb`` is the total RSS of all its processes."""

    memory_mb: int = field(default_factory=lambda: settings.default("memory_mb"))
    max_procs: int = field(default_factory=lambda: settings.default("max_procs"))
    disk_mb: int = field(default_factory=lambda: settings.default("disk_mb"))
    poll_s: float = 0.1
    disk_every: int = 10  # polls between two measures of the submission's folder

    @classmethod
    def of(cls, dt) -> "Limits":
        """The limits of a command's settings (``settings.DTLabs``)."""
        return cls(memory_mb=dt.memory_mb, max_procs=dt.max_procs, disk_mb=dt.disk_mb)


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
        paths = tuple(str(p) for p in (*course_paths(course_root), *protect))
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


def subjects_folder() -> str | None:
    """Where the separate user's folders go: the temp folder if every folder above it lets others pass, else /tmp
    (a TMPDIR inside a private folder would keep the subject from its own files)."""
    import stat
    import tempfile

    here = Path(tempfile.gettempdir()).resolve()
    if all(p.stat().st_mode & stat.S_IXOTH for p in (here, *here.parents)):
        return None
    return "/tmp"


def subject_user() -> tuple[pwd.struct_passwd | None, str | None]:
    """(the separate user's passwd entry, None) where submissions can run as it, else (None, why not)."""
    name = subject_user_name()
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


def fix(course_root=None) -> list[str]:
    """``dtlabs doctor --grading --fix`` (as root): create the separate user if missing, close the course's answers
    and gradebooks to others and make what it may only read unwritable to others. Returns what it did."""
    import stat

    if os.geteuid() != 0:
        return ["nothing fixed: only root can create the separate user (run it with sudo)"]
    done = []
    name = subject_user_name()
    try:
        pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
                        "--shell", "/usr/sbin/nologin", name], check=True, capture_output=True)
        done.append(f"created the user {name!r}")
    parents = {str(Path(p).parent) for p in course_paths(course_root)}
    for path, drop in [*((p, 0o007) for p in course_paths(course_root)),
                       *((p, 0o002) for p in [*installed_paths(), *sorted(parents)])]:
        if os.path.isdir(path) and not os.path.islink(path):
            mode_now = stat.S_IMODE(os.stat(path).st_mode)
            if mode_now & drop:
                os.chmod(path, mode_now & ~drop)
                done.append(f"chmod o-{'rwx' if drop == 0o007 else 'w'} {path}")
    _checked.clear()
    return done or ["nothing to fix"]


def installed_paths() -> list[str]:
    """The interpreter, the venv and this package: what every later grading runs, so no submission may write it."""
    paths = [os.path.dirname(os.path.realpath(sys.executable)), *_python_paths()]
    return list(dict.fromkeys(os.path.realpath(p) for p in paths if os.path.isdir(p)))


def exposure(protect=(), read_only=()) -> list[str]:
    """Asked as the separate user itself (``os.access`` in a process of its own, with no other groups): which of
    ``protect`` it can read or write, and which installed folder (``installed_paths``) or course folder it can write.
    Empty: the boundary holds."""
    import json

    entry, why = subject_user()
    if entry is None:
        return [why]
    parents = {str(Path(p).parent) for p in protect}  # the course itself: no submission adds a file to it
    try:
        run = subprocess.run(
            [sys.executable, "-I", "-S", "-c", EXPOSURE_CHECK,
             json.dumps([list(protect), installed_paths() + sorted(parents) + list(read_only)])],
            user=entry.pw_uid, group=entry.pw_gid, extra_groups=[], cwd="/", capture_output=True, text=True, timeout=60,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    except OSError as exc:  # this Python lies where that user cannot go (a venv made from a Python under /root)
        return [f"the check could not run as {entry.pw_name!r}: {sys.executable}: {exc.strerror}"]
    if run.returncode != 0:
        return [f"the check could not run as {entry.pw_name!r}: {run.stderr.strip()[-300:]}"]
    return json.loads(run.stdout)


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
    env = {k: os.environ[k] for k in KEEP_ENV if k in os.environ}
    env.update(HOME=home, TMPDIR=str(shared_tmp(home)), PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1",
               MPLBACKEND="module://matplotlib_inline.backend_inline", MPLCONFIGDIR=os.path.join(home, ".mpl"),
               PYDEVD_DISABLE_FILE_VALIDATION="1",
               # c10d warns on every connection that it cannot name the peer inside a fresh network namespace
               TORCH_CPP_LOG_LEVEL="ERROR")
    env.update(extra)
    return env


SYSTEM_DIRS = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib64", "/lib32")


@dataclass(frozen=True)
class Mount:
    """One step of building the subject's file system: ``kind`` is "tmpfs", "proc", "dev", "ro" (a read-only bind
    of ``src`` at ``dest``), "symlink" (a link at ``dest`` to ``src``) or "rw" (the submission's own folder)."""

    kind: str
    src: str
    dest: str

    def args(self) -> list[str]:
        if self.kind == "tmpfs":  # memory-backed: sized, or a submission could fill the host's memory through it
            return (["--size", self.src] if self.src else []) + ["--tmpfs", self.dest]
        if self.kind in ("proc", "dev"):
            return [f"--{self.kind}", self.dest]
        flag = {"ro": "--ro-bind", "rw": "--bind", "symlink": "--symlink"}[self.kind]
        return [flag, self.src, self.dest]


def _within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _python_paths() -> list[str]:
    """What the subject's Python needs to start and to import what the grader's imports: the interpreter's
    prefixes, every ``sys.path`` entry that is an installation folder (inside a prefix, or a site-packages), and
    this package. Other ``sys.path`` entries (a working directory, a course folder on PYTHONPATH) are left out:
    binding one could show the subject the course."""
    prefixes = {os.path.realpath(p) for p in (sys.base_prefix, sys.base_exec_prefix, sys.prefix, sys.exec_prefix)}
    paths = [sys.base_prefix, sys.base_exec_prefix, sys.prefix, sys.exec_prefix,
             os.path.dirname(os.path.realpath(sys.executable))]
    for entry in sys.path:
        if not entry or not os.path.isdir(entry):
            continue
        real = os.path.realpath(entry)
        if any(_within(real, p) for p in prefixes) or os.path.basename(real) in ("site-packages", "dist-packages"):
            paths.append(entry)
    paths.append(str(PKG_DIR))
    return paths


def mounts(workdir, tmp_mb: int | None = None) -> list[Mount]:
    """The subject's file system, in the order bwrap builds it: a private /tmp, /proc and /dev first, then the
    read-only binds from the shortest path to the longest (a bind under /tmp or inside another bind stays visible),
    the links that make the original paths of symlinked ones work, and last the submission's folder, writable, at
    its own path (so paths in the shared temp folder mean the same file on both sides)."""
    workdir = os.path.realpath(workdir)
    ro: dict[str, None] = {}
    links: dict[str, str] = {}
    for path in (*SYSTEM_DIRS, *_python_paths()):
        if not os.path.lexists(path):
            continue
        if os.path.islink(path) and path.count("/") == 1:  # merged /usr: /bin -> usr/bin stays a link
            links[path] = os.readlink(path)
            continue
        real = os.path.realpath(path)
        ro[real] = None
        if real != os.path.abspath(path):
            links[os.path.abspath(path)] = real
    binds = sorted(ro, key=lambda p: (p.count("/"), p))
    binds = [p for i, p in enumerate(binds) if not any(_within(p, q) for q in binds[:i])]  # a parent already shows it
    steps = [Mount("tmpfs", str(tmp_mb << 20) if tmp_mb else "", "/tmp"), Mount("proc", "", "/proc"),
             Mount("dev", "", "/dev")]
    steps += [Mount("ro", p, p) for p in binds]
    for link, target in sorted(links.items(), key=lambda kv: (kv[0].count("/"), kv[0])):
        if not any(_within(link, q) for q in binds):  # inside a bind, the host's own link is already there
            steps.append(Mount("symlink", target, link))
    steps.append(Mount("rw", workdir, workdir))
    return steps


def describe_mounts(workdir, limits: Limits | None = None) -> str:
    """The subject's file system in words (``dtlabs doctor --grading``)."""
    return "\n".join(f"  {m.kind:8s} {m.dest}" + (f" -> {m.src}" if m.kind == "symlink" else "")
                     for m in mounts(workdir, tmp_mb=(limits or Limits()).disk_mb))


def _matplotlib_cache() -> Path:
    """Where matplotlib keeps its font cache (``matplotlib.get_cachedir()``'s documented rule), found without
    importing matplotlib: the grader kernel starts every sandbox and otherwise never needs matplotlib."""
    if os.environ.get("MPLCONFIGDIR"):
        return Path(os.environ["MPLCONFIGDIR"])
    if sys.platform.startswith(("linux", "freebsd")):
        return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "matplotlib"
    return Path.home() / ".matplotlib"


def _prepare_home(home: Path) -> None:
    """Matplotlib's font cache copied in, so every submission does not rebuild it (seconds each)."""
    try:
        cache = _matplotlib_cache()
        dest = home / ".mpl"
        dest.mkdir(parents=True, exist_ok=True)
        for f in cache.glob("fontlist-*.json"):
            shutil.copy2(f, dest / f.name)
    except Exception:  # noqa: BLE001 - only a speed-up
        pass


def command(argv: list[str], workdir: Path, env: dict, limits: Limits | None = None) -> tuple[list[str], dict, str | None]:
    """(argv to run, environment, cwd) for ``argv`` boxed with bwrap, or prepared to run as the separate user or
    (unprotected) as this one: then in the submission's folder, with a private copy of the package first on its
    path, so ``lab_utils.__file__`` leads nowhere near the course."""
    workdir = Path(workdir).resolve()
    _prepare_home(workdir)
    shared_tmp(workdir).mkdir(exist_ok=True)
    bwrap = bwrap_path()
    if bwrap:
        inside = str(workdir)  # the same path on both sides, so paths in the shared temp folder mean the same file
        cmd = [bwrap, "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-net", "--unshare-ipc",
               "--unshare-uts", "--unshare-cgroup-try", "--cap-drop", "ALL",
               "--clearenv"]
        for step in mounts(workdir, tmp_mb=(limits or Limits()).disk_mb):
            cmd += step.args()
        cmd += ["--chdir", inside]
        for k, v in _env(inside, env).items():
            cmd += ["--setenv", k, v]
        return cmd + ["--"] + argv, {}, None
    # a private copy of lab_utils first on the path: lab_utils.__file__ then leads nowhere near the course
    private = workdir / ".dtlabs_pkg"
    shutil.copytree(PKG_DIR, private / "lab_utils", ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True)
    if mode() == "user":
        hand_over(workdir)
    else:
        warn_unprotected_once()
    return argv, _env(str(workdir), {**env, "PYTHONPATH": str(private), "PYTHONNOUSERSITE": "1"}), str(workdir)


def hand_over(workdir: Path) -> None:
    """Make the submission's folder the separate user's: owned by it, shared with the grader through its group
    (setgid folders, so what the grader's kernel writes there, a checkpoint or the relay's socket, stays the
    subject's to use: ``start_grading`` sets that kernel's umask to 002), closed to everyone else."""
    entry, why = subject_user()
    if entry is None:
        raise SandboxUnavailable(why)
    for folder, dirs, files in os.walk(workdir):
        os.lchown(folder, entry.pw_uid, entry.pw_gid)
        os.chmod(folder, 0o2770)
        for name in files:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                os.lchown(path, entry.pw_uid, entry.pw_gid)
                os.chmod(path, 0o660 | (os.stat(path).st_mode & 0o110))


def folder_bytes(folder: Path, stop_at: int) -> int:
    """Bytes under ``folder`` (no link followed), counted until they pass ``stop_at``; every 1000 entries count
    as a MB too, so a flood of empty files is caught as well."""
    total, entries, stack = 0, 0, [str(folder)]
    while stack and total <= stop_at:
        try:
            with os.scandir(stack.pop()) as it:
                for entry in it:
                    entries += 1
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                    elif entry.is_file(follow_symlinks=False):
                        total += entry.stat(follow_symlinks=False).st_size
        except OSError:
            continue
    return total + (entries // 1000 << 20)


def _memory(procs, kind: str) -> int:
    """Bytes of memory of ``procs``: ``rss`` (fast) or ``pss`` (shared pages divided among the processes mapping
    them, so a sum over processes counts each page once; read from /proc/PID/smaps_rollup)."""
    import psutil

    total = 0
    for p in procs:
        try:
            info = p.memory_full_info() if kind == "pss" else p.memory_info()
            total += getattr(info, kind, None) or info.rss
        except psutil.Error:
            pass
    return total


def _limit_resources(memory_mb: int) -> None:  # runs in the child between fork and exec
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    cap = memory_mb * 4 << 20  # address space per process: generous (torch reserves far more than it touches)
    try:
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    except (ValueError, OSError):
        pass


@dataclass
class Box:
    """A running sandboxed program, its watchdog, and why it was stopped (if it was)."""

    popen: subprocess.Popen
    mode: str
    limits: Limits
    reason: str | None = None
    caller_baseline: int | None = None  # the starting process's RSS at the start, when its growth counts too
    workdir: Path | None = None  # the submission's folder, measured against the disk limit
    lock: int | None = None  # as the separate user: the machine-wide lock held while this subject lives
    uid: int | None = None  # ... and that user, every process of which is this submission's
    _stop: threading.Event = field(default_factory=threading.Event)

    def members(self) -> list:
        return processes.tree(self.popen.pid, include_orphans=self.mode != "bwrap")

    def _watch(self) -> None:
        polls = 0
        while not self._stop.wait(self.limits.poll_s):
            if self.popen.poll() is not None:
                return
            polls += 1
            if self.check(disk=polls % self.limits.disk_every == 0):
                return

    def check(self, disk: bool = True) -> bool:
        """Measure the submission against its limits once (``disk``: its folder too); over one, stop it and keep the
        reason. True if it was stopped. The watchdog calls it every ``poll_s``; the grader once more at the end, so
        a flood that a loaded machine's watchdog had not yet seen is named as well."""
        import psutil

        if disk and self.workdir is not None:
            used = folder_bytes(self.workdir, stop_at=self.limits.disk_mb << 20)
            if used > self.limits.disk_mb << 20:
                self.kill(f"disk limit: the submission wrote more than {self.limits.disk_mb} MB")
                return True
        procs = self.members()
        if len(procs) > self.limits.max_procs:
            self.kill(f"process limit: the submission started more than {self.limits.max_procs} processes")
            return True
        grown = 0
        if self.caller_baseline is not None:  # the grader holding what the submission sent it
            grown = max(0, psutil.Process().memory_info().rss - self.caller_baseline)
        limit = self.limits.memory_mb << 20
        # RSS first (cheap); a sum of RSS counts each shared page (libtorch, a framework's shared memory) once per
        # process that maps it, so over the limit the decision is taken on PSS, where shared pages count once
        if _memory(procs, "rss") + grown > limit:
            used = _memory(procs, "pss") + grown
            if used > limit:
                # how far over is the submission's to choose (a grade line can reach the student): only the limit
                self.kill(f"memory limit: the submission's processes used more than {self.limits.memory_mb} MB")
                return True
        return False

    def rebase_caller(self) -> None:
        """Count the starting process's growth from now (after its own start-up imports)."""
        if self.caller_baseline is not None:
            import psutil

            self.caller_baseline = psutil.Process().memory_info().rss

    def kill(self, reason: str | None = None) -> None:
        if reason and not self.reason:
            self.reason = reason
        processes.kill_tree(self.popen.pid, include_orphans=self.mode != "bwrap")
        try:
            self.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass

    def close(self) -> None:
        self._stop.set()
        self.kill()
        if self.lock is not None:  # whatever of the separate user still runs is this submission's: it goes first
            _kill_user(self.uid)
            os.close(self.lock)
            self.lock = None


def _kill_user(uid: int) -> None:
    import psutil

    processes.kill_procs([p for p in psutil.process_iter(["uids"]) if p.info["uids"] and p.info["uids"].real == uid])


def _one_subject_at_a_time(uid: int) -> int:
    """Two subjects of one user could signal, trace or read each other's processes: on a machine, the separate user
    runs one submission at a time (``dtlabs grade --jobs`` and concurrent ``grade-one`` tasks wait here), and what a
    crashed grading left running as that user is killed before the next starts."""
    import fcntl

    fd = os.open(f"/run/lock/dtlabs-subject-{uid}.lock" if os.path.isdir("/run/lock") else
                 f"/tmp/dtlabs-subject-{uid}.lock", os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    _kill_user(uid)
    return fd


def start(argv: list[str], workdir: Path, *, env: dict | None = None, pass_fds=(), limits: Limits | None = None,
          stdout=None, count_caller: bool = False) -> Box:
    """Start ``argv`` in a sandbox around ``workdir``; returns the running ``Box`` with its watchdog.
    ``count_caller``: this process's memory growth from now on counts against the submission's memory limit."""
    limits = limits or Limits()
    cmd, full_env, cwd = command(argv, workdir, env or {}, limits)
    box_mode = mode()
    if box_mode != "bwrap":
        processes.become_subreaper()  # orphans of the submission come back to us, so they can be found
    as_user, lock = {}, None
    if box_mode == "user":  # no supplementary groups: the subject is its own user and group, nothing more
        entry = subject_user()[0]
        as_user = dict(user=entry.pw_uid, group=entry.pw_gid, extra_groups=[])
        lock = _one_subject_at_a_time(entry.pw_uid)
    popen = subprocess.Popen(
        cmd, env=full_env, cwd=cwd, pass_fds=tuple(pass_fds), stdin=subprocess.DEVNULL, stdout=stdout,
        stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=lambda: _limit_resources(limits.memory_mb),
        **as_user,
    )
    import psutil

    box = Box(popen, box_mode, limits, caller_baseline=psutil.Process().memory_info().rss if count_caller else None,
              workdir=Path(workdir), lock=lock, uid=as_user.get("user"))
    threading.Thread(target=box._watch, daemon=True, name="dtlabs-sandbox-watchdog").start()
    return box
