"""What a submission could change to gain, kept in memory and put back: the fallback's defence of the course.

Without bubblewrap a submission runs as the grader's own user and can write any file it finds (grader/README.md,
threat model). The files through which such a write would raise a grade or damage another student are few: the
course's gradebook and grading records, the submitted notebooks, the per-lab template gradebooks, and the code
the grader runs (``lab_utils``, ``solutions/``, ``grader/`` config). ``Guard`` reads them into memory while no
submission runs; after each submission's sandbox is gone, ``restore`` puts back every byte that changed and
removes what appeared, and names the files, so that submission's grade line says what it did. ``dtlabs grade``
therefore grades one submission at a time in the fallback: a check between two submissions can only tell who
changed a file when one ran.

Not guarded (and said so in the threat model): files outside the course (the venv, the home folder), the
autograded and feedback notebooks (outputs, rebuilt from the gradebook), and anything a submission changes and
undoes before it ends.
"""
from __future__ import annotations

import os
from pathlib import Path


class Guard:
    """Files under ``roots`` (files or folders) as they were at the last ``snapshot``; ``skip`` folders are left out."""

    def __init__(self, roots, skip=()):
        self.roots = [Path(r) for r in roots]
        self.skip = [Path(s) for s in skip]
        self.files: dict[Path, bytes] = {}

    def _walk(self):
        for root in self.roots:
            if root.is_file():
                yield root
            elif root.is_dir():
                for dirpath, dirnames, filenames in os.walk(root):
                    here = Path(dirpath)
                    dirnames[:] = [d for d in dirnames if d != "__pycache__" and here / d not in self.skip]
                    for name in filenames:
                        yield here / name

    def snapshot(self) -> None:
        """Remember every guarded file now (call it while no submission runs)."""
        self.files = {}
        for path in self._walk():
            try:
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
        for path in list(self._walk()):
            if path not in self.files:
                _remove(path)
                changed.append(str(path))
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
