"""What a submission could change to gain, kept in memory and put back: the unprotected mode's defence of the course.

Unprotected (``--unprotected``), a submission runs as the grader's own user and can write any file it finds (grader/README.md,
threat model). The files through which such a write would raise a grade or damage another student are few: the
course's gradebook and grading records, the submitted notebooks, the per-lab template gradebooks, and the code
the grader runs (``lab_utils``, ``solutions/``, ``grader/`` config). ``Guard`` reads them into memory while no
submission runs; after each submission's sandbox is gone, ``restore`` puts back every byte that changed and
removes what appeared, and names the files, so that submission's grade line says what it did. ``dtlabs grade``
therefore grades one submission at a time unprotected: a check between two submissions can only tell who
changed a file when one ran.

``StartupWatch`` watches what a later grading process runs at its start (the venv, the user's Jupyter and IPython
folders): what appeared is removed, and any other change stops grading. Not guarded (and said so in the threat
model): the rest of the home folder and the machine, the autograded and feedback notebooks (outputs, rebuilt from
the gradebook), and anything a submission changes and undoes before it ends.
"""
from __future__ import annotations

import os
from pathlib import Path


class Guard:
    """Files under ``roots`` (files or folders) as they were at the last ``snapshot``; ``skip`` folders are left out."""

    def __init__(self, roots, skip=(), watch: "StartupWatch | None" = None):
        self.roots = [Path(r) for r in roots]
        self.skip = [Path(s) for s in skip]
        self.files: dict[Path, bytes] = {}
        self.links: dict[Path, str] = {}  # symbolic links to folders, and where they point
        self.watch = watch

    def _walk(self):
        """Every file under the roots, and every symbolic link to a folder there (as a path, never followed: one a
        submission plants is removed like a planted file)."""
        for root in self.roots:
            if root.is_file():
                yield root
            elif root.is_dir():
                for dirpath, dirnames, filenames in os.walk(root):
                    here = Path(dirpath)
                    linked = [d for d in dirnames if (here / d).is_symlink()]
                    dirnames[:] = [d for d in dirnames
                                   if d != "__pycache__" and here / d not in self.skip and d not in linked]
                    for name in filenames + linked:
                        yield here / name

    def snapshot(self, watch: bool = True) -> None:
        """Remember every guarded file now (call it while no submission runs). ``watch=False`` right after
        ``restore``: the startup watch keeps its baseline, which a passed check leaves true (what appeared is removed,
        anything else changed stops grading; only bytecode may be gone), and scanning again costs about a second per
        hundred thousand files with only this process, which writes none of it, run since."""
        if self.watch is not None and watch:
            self.watch.snapshot()
        self.files, self.links = {}, {}
        for path in self._walk():
            try:
                if path.is_symlink() and path.is_dir():
                    self.links[path] = os.readlink(path)
                else:
                    self.files[path] = path.read_bytes()
            except OSError:
                pass

    def restore(self) -> list[str]:
        """Put back every guarded file that changed or went missing and remove the ones that appeared; returns
        their paths (empty when nothing was touched). Raises ``GuardError`` if a file cannot be put back."""
        changed = []
        for path, data in self.files.items():
            root = next(r for r in self.roots if path == r or r in path.parents)
            try:
                same = not _symlinked(path, root) and path.read_bytes() == data
            except OSError:
                same = False
            if same:
                continue
            try:
                _unlink_symlinks(path, root)
                _remove(path)  # a replaced file, folder or link: gone first, so the bytes land in the course
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
            except OSError as exc:
                raise GuardError(f"could not put back {path}: {exc}") from exc
            changed.append(str(path))
        for path, target in self.links.items():
            try:
                if path.is_symlink() and os.readlink(path) == target:
                    continue
                _remove(path)
                path.parent.mkdir(parents=True, exist_ok=True)
                os.symlink(target, path)
            except OSError as exc:
                raise GuardError(f"could not put back {path}: {exc}") from exc
            changed.append(str(path))
        for path in list(self._walk()):
            if path not in self.files and path not in self.links:
                _remove(path)
                changed.append(str(path))
        if self.watch is not None:
            changed += self.watch.check()
        return changed


class GuardError(RuntimeError):
    """A guarded file could not be put back: the course can no longer be trusted, so grading stops."""


def _symlinked(path: Path, root: Path) -> bool:
    """Whether ``path`` or a folder between it and ``root`` is a symbolic link (a write would land elsewhere)."""
    return any(p.is_symlink() for p in (path, *path.parents) if root in p.parents)


def _unlink_symlinks(path: Path, root: Path) -> None:
    for p in reversed([path.parent, *path.parent.parents]):
        if root in p.parents and p.is_symlink():
            p.unlink()


def _remove(path: Path) -> None:
    import shutil

    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


class StartupWatch:
    """Where code runs from when a grading process starts, watched across one unprotected submission: the venv and
    interpreter (a ``.pth`` file or ``sitecustomize`` in site-packages runs in every later Python), the user's
    Jupyter and IPython configuration and kernel specs, and user site-packages. These are too large to keep in
    memory as ``Guard`` keeps the course, so ``check`` compares names, sizes, inodes, modes and times: a file that
    appeared is removed (so is any changed bytecode, which Python rebuilds), and any other change stops grading, since
    only a reinstall can put it back. The times include the inode's change time, which the kernel sets on every write
    and ``utime`` and no ordinary user can set back: a module rewritten at the same size with its modification time
    put back is still seen."""

    def __init__(self, roots, config_roots=(), jupyter_roots=(), skip_names=("runtime", "__pycache__")):
        roots = sorted({Path(r) for r in roots if Path(r).exists()}, key=lambda r: len(r.parts))
        self.roots = [r for i, r in enumerate(roots) if not any(q in r.parents for q in roots[:i])]  # every file counts
        self.config_roots = [Path(r) for r in config_roots if Path(r).exists()]  # files that configure or run code
        self.jupyter_roots = [Path(r) for r in jupyter_roots if Path(r).exists()]  # what Jupyter reads there only
        self.skip_names = set(skip_names)
        self.seen: dict[str, tuple] = {}

    def _walks(self):
        """(root, every file counts) for each folder to scan; a Jupyter path entry (a course's ``grader/`` on
        ``JUPYTER_CONFIG_PATH``) only as far as Jupyter reads it, since grading writes its own records beside that."""
        for root in self.roots:
            yield root, True
        yield from ((root, False) for root in self.config_roots)
        for root in self.jupyter_roots:
            yield root, None

    def _scan(self) -> dict[str, tuple]:
        """Every file's and every symbolic link's ``lstat`` (a link is never followed, and always counts: one to a
        folder named ``sitecustomize`` or ``kernels`` runs code as surely as a file there). ``os.scandir`` rather than
        ``os.walk``: a quarter less CPU on a venv's hundred thousand files, scanned once per submission."""
        seen = {}
        for root, every in self._walks():
            top = str(root)
            folders = [top]
            while folders:
                here = folders.pop()
                try:
                    entries = list(os.scandir(here))
                except OSError:
                    continue
                for entry in entries:
                    name = entry.name
                    try:
                        link = entry.is_symlink()
                        if not link and entry.is_dir(follow_symlinks=False):
                            if every is None and here == top and not (name in JUPYTER_READS or name.endswith(".d")):
                                continue
                            if every or name not in self.skip_names:
                                folders.append(entry.path)
                            continue
                        if not (every or link or name.endswith(CODE_SUFFIXES)):
                            continue  # a history database, a cache: written by every session, running nothing
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    seen[entry.path] = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_mode)
        return seen

    def snapshot(self) -> None:
        self.seen = self._scan()

    def check(self) -> list[str]:
        """Undo what can be undone; returns the files that appeared (removed). Raises ``GuardError`` naming what
        changed that cannot be put back."""
        now = self._scan()
        added, broken = [], []
        for path, info in now.items():
            bytecode = path.endswith((".pyc", ".pyo"))
            if path not in self.seen:
                _remove(Path(path))
                if not bytecode:
                    added.append(path)
            elif info != self.seen[path]:
                if bytecode:
                    _remove(Path(path))
                else:
                    broken.append(path)
        broken += [p for p in self.seen if p not in now and not p.endswith((".pyc", ".pyo"))]
        if broken:
            raise GuardError(f"a submission changed what every later grading runs, which only a reinstall puts back: "
                             f"{', '.join(sorted(broken)[:5])}")
        return added


# the folders of a Jupyter config or data path entry that Jupyter reads (its config files lie at the top)
JUPYTER_READS = ("nbconfig", "labconfig", "serverconfig", "custom", "kernels", "nbextensions", "labextensions", "lab")
CODE_SUFFIXES = (".py", ".pth", ".json", ".ipy", ".pyc", ".so", ".sh", ".cfg", ".toml", ".ini", ".yaml", ".yml")


def startup_watch() -> StartupWatch:
    """The interpreter and the venv (every file), and the user's Python and Jupyter folders this user can write
    (their configuration, kernel specs, startup files and user site-packages)."""
    from jupyter_core import paths

    from lab_utils.grading.boundary import mounts

    home = Path.home()
    mine = [home / ".jupyter", home / ".ipython", home / ".local", home / ".config"]
    jupyter = [*map(Path, paths.jupyter_config_path()), *map(Path, paths.jupyter_path())]
    installed = mounts.installed_paths()

    def writable(folders):
        return list(dict.fromkeys(str(p) for p in folders if p.exists() and os.access(p, os.W_OK)
                                  and not any(str(p.resolve()).startswith(i) for i in installed)))

    config = writable(mine)
    return StartupWatch(installed, config, [p for p in writable(jupyter)
                                            if not any(mounts.within(p, c) for c in config)])
