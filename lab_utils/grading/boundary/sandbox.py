"""The box a submission's code runs in while it is graded: bubblewrap when present, folder isolation otherwise.

With ``bwrap`` (Debian package ``bubblewrap``) the subject sees a root built from read-only binds of the
system, the Python installation, the course venv and the ``lab_utils`` package, plus its own throwaway
folder; nothing else of the course (``solutions/``, ``grader/``, the gradebook, other students) exists there.
It gets a private ``/tmp``, its own PID, network (loopback only), IPC and UTS namespaces, no capabilities, a
scrubbed environment, and it dies with its parent; when its first process exits the kernel kills every
process left in its PID namespace, however it was started.

Without ``bwrap`` (a student's laptop, a machine where it cannot run) the same program runs with the
throwaway folder as its home and working directory, the scrubbed environment, a private copy of
``lab_utils`` first on its path and the same resource limits, and a warning says once what is weaker.

Either way a watchdog enforces the submission's memory (total RSS of its processes) and process-count limits,
and records why it stopped the box, so a grade can say "memory limit" instead of "dead kernel".
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import warnings
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from lab_utils import processes, settings

PKG_DIR = processes.PACKAGE_DIR
ENVIRONMENT = "environment:"  # a reason that carries this is the grading machine's fault, never the student's
# the variables a subject keeps; everything else (DTLABS_COURSE_ROOT, JUPYTER_*, tokens...) is dropped
KEEP_ENV = ("PATH", "LANG", "LC_ALL", "TZ", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES",
            "NVIDIA_VISIBLE_DEVICES", "TORCH_SPEC",
            "DTLABS_TEST_TOKEN", "DTLABS_GRADING_TOKEN")  # random markers the leak checks count processes by
FALLBACK_WARNING = (
    "dtlabs: bubblewrap (bwrap) is not available, so submissions run with folder isolation and resource limits "
    "only: their code cannot change a grade, but it could read or write files of this machine that it finds by "
    "absolute path (dtlabs grade puts back the course's grading files, one submission at a time). Install "
    "Debian's 'bubblewrap' for the full sandbox."
)


@dataclass
class Limits:
    """What one submission may use (``c.DTLabs.memory_mb`` / ``max_procs``). ``memory_mb`` is the total RSS of all
    its processes."""

    memory_mb: int = field(default_factory=lambda: settings.load().memory_mb)
    max_procs: int = field(default_factory=lambda: settings.load().max_procs)
    disk_mb: int = field(default_factory=lambda: settings.load().disk_mb)
    poll_s: float = 0.1
    disk_every: int = 10  # polls between two measures of the submission's folder


class SandboxUnavailable(RuntimeError):
    """The course asks for bubblewrap (``c.DTLabs.sandbox = "bwrap"``) and it cannot build a sandbox here."""


_chosen: str | None = None  # the course's c.DTLabs.sandbox, when the grader was told it (``require``)


def require(choice: str | None) -> None:
    """Grade with ``choice`` ("auto", "bwrap", "off"; None: the environment's setting) in this process; "bwrap"
    raises ``SandboxUnavailable`` with the reason when bubblewrap cannot run here."""
    global _chosen
    _chosen = choice
    if choice == "bwrap" and not bwrap_path():
        raise SandboxUnavailable(
            "the course requires bubblewrap (c.DTLabs.sandbox = 'bwrap') and it cannot build a sandbox here: "
            + (probe_failure() or "bwrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)"))


def _choice() -> str:
    return _chosen or settings.load().sandbox


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


def bwrap_path() -> str | None:
    """The bwrap binary if it can actually build a sandbox here (it cannot in some containers), unless
    ``c.DTLabs.sandbox`` is "off"."""
    if _choice() == "off":
        return None
    return _probe()[0]


def probe_failure() -> str | None:
    """Why bubblewrap cannot be used here, or None when it can."""
    return _probe()[1]


def mode() -> str:
    """'bwrap' or 'fallback'."""
    return "bwrap" if bwrap_path() else "fallback"


_warned = False


def warn_fallback_once() -> None:
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(FALLBACK_WARNING, RuntimeWarning, stacklevel=2)


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


def describe_mounts(workdir) -> str:
    """The subject's file system in words (``dtlabs doctor --grading``)."""
    return "\n".join(f"  {m.kind:8s} {m.dest}" + (f" -> {m.src}" if m.kind == "symlink" else "")
                     for m in mounts(workdir, tmp_mb=Limits().disk_mb))


def _matplotlib_cache() -> Path:
    """Where matplotlib keeps its font cache (``matplotlib.get_cachedir()``'s documented rule), found without
    importing matplotlib: the grader kernel starts every sandbox and otherwise never needs it (0.2 CPU-s each)."""
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
    """(argv to run, environment, cwd) for ``argv`` boxed with bwrap, or prepared for the fallback."""
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
    warn_fallback_once()
    # a private copy of lab_utils first on the path: lab_utils.__file__ then leads nowhere near the course
    private = workdir / ".dtlabs_pkg"
    shutil.copytree(PKG_DIR, private / "lab_utils", ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True)
    return argv, _env(str(workdir), {**env, "PYTHONPATH": str(private)}), str(workdir)


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
    _stop: threading.Event = field(default_factory=threading.Event)

    def members(self) -> list:
        return processes.tree(self.popen.pid, include_orphans=self.mode == "fallback")

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
        processes.kill_tree(self.popen.pid, include_orphans=self.mode == "fallback")
        try:
            self.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass

    def close(self) -> None:
        self._stop.set()
        self.kill()


def start(argv: list[str], workdir: Path, *, env: dict | None = None, pass_fds=(), limits: Limits | None = None,
          stdout=None, count_caller: bool = False) -> Box:
    """Start ``argv`` in a sandbox around ``workdir``; returns the running ``Box`` with its watchdog.
    ``count_caller``: this process's memory growth from now on counts against the submission's memory limit."""
    limits = limits or Limits()
    cmd, full_env, cwd = command(argv, workdir, env or {}, limits)
    box_mode = mode()
    if box_mode == "fallback":
        processes.become_subreaper()  # orphans of the submission come back to us, so they can be found
    popen = subprocess.Popen(
        cmd, env=full_env, cwd=cwd, pass_fds=tuple(pass_fds), stdin=subprocess.DEVNULL, stdout=stdout,
        stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=lambda: _limit_resources(limits.memory_mb),
    )
    import psutil

    box = Box(popen, box_mode, limits, caller_baseline=psutil.Process().memory_info().rss if count_caller else None,
              workdir=Path(workdir))
    threading.Thread(target=box._watch, daemon=True, name="dtlabs-sandbox-watchdog").start()
    return box
