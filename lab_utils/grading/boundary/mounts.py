"""The subject's file system under bubblewrap, derived from what its Python needs: the system folders, the
interpreter's prefixes, the installation folders on ``sys.path`` and this package, read-only; a private ``/tmp``,
``/proc`` and ``/dev``; and the submission's own folder, writable. ``installed_paths`` is the same list seen from the
other side: what every later grading runs, which no submission (in any mode) may write."""
from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from lab_utils import processes

PKG_DIR = processes.PACKAGE_DIR

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


def within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def python_paths() -> list[str]:
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
        if any(within(real, p) for p in prefixes) or os.path.basename(real) in ("site-packages", "dist-packages"):
            paths.append(entry)
    paths.append(str(PKG_DIR))
    return paths


def installed_paths() -> list[str]:
    """The interpreter, the venv and this package: what every later grading runs, so no submission may write it."""
    paths = [os.path.dirname(os.path.realpath(sys.executable)), *python_paths()]
    return list(dict.fromkeys(os.path.realpath(p) for p in paths if os.path.isdir(p)))


def installed_inside(workdir) -> list[str]:
    """The installed paths inside a submission's folder (a notebook beside the course's venv, or above an editable
    checkout): the subject may write its own folder, and the grader never imports from it, so neither could hold."""
    folder = os.path.realpath(workdir)
    return [p for p in installed_paths() if within(p, folder)]


def mounts(workdir, tmp_mb: int | None = None, sockets: str | None = None) -> list[Mount]:
    """The subject's file system, in the order bwrap builds it: a private /tmp, /proc and /dev first, then the
    read-only binds from the shortest path to the longest (a bind under /tmp or inside another bind stays visible),
    the links that make the original paths of symlinked ones work, then the submission's folder, writable, at
    its own path (so paths in the shared temp folder mean the same file on both sides), and last, read-only at its
    own path, the folder where the grader makes the sockets the subject reaches (``sockets``)."""
    workdir = os.path.realpath(workdir)
    ro: dict[str, None] = {}
    links: dict[str, str] = {}
    for path in (*SYSTEM_DIRS, *python_paths()):
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
    binds = [p for i, p in enumerate(binds) if not any(within(p, q) for q in binds[:i])]  # a parent already shows it
    steps = [Mount("tmpfs", str(tmp_mb << 20) if tmp_mb else "", "/tmp"), Mount("proc", "", "/proc"),
             Mount("dev", "", "/dev")]
    steps += [Mount("ro", p, p) for p in binds]
    for link, target in sorted(links.items(), key=lambda kv: (kv[0].count("/"), kv[0])):
        if not any(within(link, q) for q in binds):  # inside a bind, the host's own link is already there
            steps.append(Mount("symlink", target, link))
    steps.append(Mount("rw", workdir, workdir))
    if sockets:
        steps.append(Mount("ro", sockets, sockets))
    return steps


def matplotlib_cache() -> Path:
    """Where matplotlib keeps its font cache (``matplotlib.get_cachedir()``'s documented rule), found without
    importing matplotlib: the grader kernel starts every sandbox and otherwise never needs matplotlib."""
    if os.environ.get("MPLCONFIGDIR"):
        return Path(os.environ["MPLCONFIGDIR"])
    if sys.platform.startswith(("linux", "freebsd")):
        return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "matplotlib"
    return Path.home() / ".matplotlib"


def prepare_home(home: Path) -> None:
    """Matplotlib's font cache copied in, so every submission does not rebuild it (seconds each)."""
    try:
        cache = matplotlib_cache()
        dest = home / ".mpl"
        dest.mkdir(parents=True, exist_ok=True)
        for f in cache.glob("fontlist-*.json"):
            shutil.copy2(f, dest / f.name)
    except Exception:  # noqa: BLE001 - only a speed-up
        pass
