"""A submission's files, copied as data: regular files and folders only, never through a link, within limits.

A submission folder is the student's to shape. Copied with ``shutil.copytree``'s defaults, a symbolic link in it is
followed: a link to ``solutions/<lab>/<lab>.ipynb`` hands the solution to the answer cells (and back in the
feedback), a link to another student's folder hands over their work, and a link to a folder above the submission
makes the copy recurse through the course until the disk is full. ``copy_submission`` copies what is really there
and leaves out, by name, every link, every special file (a FIFO would block the copy, a device could be read) and
everything past the size limits, so a grade line can say what was left out and why.
"""
from __future__ import annotations

import os
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path

MAX_FILES = 2000
MAX_BYTES = 256 << 20  # a submission's files, all together


@dataclass
class Copied:
    """What ``copy_submission`` did: the files copied, and each thing it left out with the reason."""

    files: list = field(default_factory=list)
    left_out: list = field(default_factory=list)  # "name (why)"
    bytes: int = 0

    def note(self) -> str:
        """A grade line's words for what was left out ('' if nothing was)."""
        if not self.left_out:
            return ""
        shown = ", ".join(self.left_out[:5]) + (f" and {len(self.left_out) - 5} more" if len(self.left_out) > 5 else "")
        return f"not copied from the submission: {shown}"


class SubmissionError(ValueError):
    """The submission cannot be graded as it is (its notebook is a link, or not a regular file)."""


def copy_submission(src, dest, *, skip=None, max_files: int = MAX_FILES, max_bytes: int = MAX_BYTES) -> Copied:
    """Copy the regular files and folders under ``src`` into ``dest`` (created), following no link.

    ``skip(relative_path, is_dir) -> bool`` leaves chosen entries out silently (the notebooks, a temp folder).
    Links, special files and whatever lies past ``max_files`` / ``max_bytes`` are left out and reported."""
    src, dest = Path(src), Path(dest)
    if src.is_symlink() or not src.is_dir():
        raise SubmissionError(f"{src} is not a folder (a submission is a folder of regular files)")
    done = Copied()
    dest.mkdir(parents=True, exist_ok=True)
    for dirpath, dirnames, filenames in os.walk(src, followlinks=False):
        here = Path(dirpath)
        rel_dir = here.relative_to(src)
        keep = []
        for name in sorted(dirnames):
            rel = rel_dir / name
            mode = os.lstat(here / name).st_mode
            if skip is not None and skip(rel, True):
                continue
            if stat.S_ISLNK(mode):
                done.left_out.append(f"{rel} (a symbolic link)")
                continue
            (dest / rel).mkdir(exist_ok=True)
            keep.append(name)
        dirnames[:] = keep
        for name in sorted(filenames):
            rel = rel_dir / name
            if skip is not None and skip(rel, False):
                continue
            info = os.lstat(here / name)
            if stat.S_ISLNK(info.st_mode):
                done.left_out.append(f"{rel} (a symbolic link)")
            elif not stat.S_ISREG(info.st_mode):
                done.left_out.append(f"{rel} (not a regular file)")
            elif len(done.files) >= max_files:
                done.left_out.append(f"{rel} (over {max_files} files)")
            elif done.bytes + info.st_size > max_bytes:
                done.left_out.append(f"{rel} (over {max_bytes >> 20} MB in all)")
            else:
                _copy_regular(here / name, dest / rel)
                done.files.append(str(rel))
                done.bytes += info.st_size
    return done


def _copy_regular(src: Path, dest: Path) -> None:
    """Copy one regular file, refusing to open anything else (the file could be swapped for a FIFO meanwhile)."""
    fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SubmissionError(f"{src} is not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as fin, open(dest, "wb") as fout:
            shutil.copyfileobj(fin, fout)
    finally:
        os.close(fd)
    shutil.copystat(src, dest, follow_symlinks=False)


def regular_notebook(path) -> Path:
    """``path`` if it is a regular file (not a link), else ``SubmissionError`` saying what it is."""
    path = Path(path)
    if path.is_symlink():
        raise SubmissionError(f"the notebook {path.name} is a symbolic link, not a file")
    if not path.is_file():
        raise SubmissionError(f"the notebook {path.name} is missing")
    return path


def _open_below(base_fd: int, rel: str) -> int:
    """A descriptor of the folder ``rel`` below the open folder ``base_fd``, walked one name at a time without
    following a link (a name the subject swapped for one fails: ELOOP)."""
    fd = os.dup(base_fd)
    for part in Path(rel).parts:
        try:
            fd_next = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
        finally:
            os.close(fd)
        fd = fd_next
    return fd


def group_mkdtemp(subject_dir: str, group_mode: int = 0o2770):
    """``tempfile.mkdtemp`` for the grader's kernel while the submission runs as the separate user: a folder made
    under ``subject_dir`` (the subject's, which it can write) is the subject's group's too (``group_mode``), so the
    subject's ranks can write the checkpoint a test cell named there. Every step is taken on descriptors: the path is
    walked from the subject's folder without following a link, the folder is made and opened below the last
    descriptor, and its mode set with ``fchmod``, so a link the subject put in its place (attack #5 of the relay's
    socket: root made to chmod a file of its choice) is never followed. Folders elsewhere are ``mkdtemp``'s."""
    import tempfile
    import uuid

    base = os.path.realpath(subject_dir)
    plain = getattr(tempfile.mkdtemp, "__wrapped__", tempfile.mkdtemp)  # one subject after another: no chain

    def mkdtemp(suffix=None, prefix=None, dir=None):
        where = os.path.abspath(dir if dir is not None else tempfile.gettempdir())
        if not (where == base or where.startswith(base + os.sep)):
            return plain(suffix, prefix, dir)
        base_fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            parent = _open_below(base_fd, os.path.relpath(where, base))
        finally:
            os.close(base_fd)
        try:
            for _ in range(100):
                name = f"{prefix if prefix is not None else tempfile.template}{uuid.uuid4().hex[:8]}{suffix or ''}"
                try:
                    os.mkdir(name, 0o700, dir_fd=parent)
                except FileExistsError:
                    continue
                made = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent)
                try:
                    os.fchmod(made, group_mode)
                finally:
                    os.close(made)
                return os.path.join(where, name)
        finally:
            os.close(parent)
        raise FileExistsError("no usable temporary folder name")

    mkdtemp.__wrapped__ = plain
    return mkdtemp
