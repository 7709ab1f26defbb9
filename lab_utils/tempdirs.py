"""Temp folders a killed process does not leave behind: each is named for its owner (pid namespace and pid), so a
later process can tell a dead owner's folder from a live one's and remove it (SIGKILL runs no cleanup: a grading
killed by a scheduler's time limit, a torchrun harness killed with its kernel)."""
from __future__ import annotations

import os


def _pid_namespace() -> str:
    """This process's pid namespace (its inode): a pid means something only inside it, and a temp folder may be
    shared by containers that each have their own."""
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return "0"


def owned_tempdir(prefix: str, tag: str = "", dir: str | None = None) -> str:
    """``tempfile.mkdtemp`` named ``PREFIX<pid namespace>-<pid>-[TAG-]...``: its owner removes it when done, and where
    the owner was killed first (SIGKILL runs no cleanup), a later ``remove_orphaned_tempdirs(PREFIX)`` does."""
    import tempfile

    return tempfile.mkdtemp(prefix=f"{prefix}{_pid_namespace()}-{os.getpid()}-{tag + '-' if tag else ''}", dir=dir)


def remove_orphaned_tempdirs(prefixes: str | tuple, parents=None) -> list[str]:
    """Remove the ``owned_tempdir(PREFIX)`` folders, for each of ``prefixes``, in ``parents`` (default: the temp
    folder) whose owner is gone, and no other: not a live owner's, not one of another pid namespace's (another
    container sharing the folder). Each parent is listed once. Returns what was removed."""
    import shutil
    import tempfile

    import psutil

    ns = _pid_namespace()
    mine = tuple(f"{prefix}{ns}-" for prefix in ((prefixes,) if isinstance(prefixes, str) else prefixes))
    removed = []
    for parent in dict.fromkeys(parents or [tempfile.gettempdir()]):
        try:
            names = os.listdir(parent)
        except OSError:
            continue
        for name in names:
            start = next((m for m in mine if name.startswith(m)), None)
            pid = name[len(start):].split("-", 1)[0] if start else ""
            if not pid.isdigit() or psutil.pid_exists(int(pid)):
                continue
            path = os.path.join(parent, name)
            shutil.rmtree(path, ignore_errors=True)
            if not os.path.exists(path):
                removed.append(path)
    return removed
