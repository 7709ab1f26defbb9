"""Where a process's cgroups are: /proc/PID/cgroup and /proc/PID/mountinfo read into the folders of its own cgroup
and its ancestors, per controller (cgroup v1, v2 and the hybrid layout), and the small readers of cgroup files the
other modules share. Every reader takes ``proc`` and ``root`` so tests can point it at a fake tree."""
from __future__ import annotations

import os
from dataclasses import dataclass

V2 = ""  # the unified hierarchy's "controller" name, as /proc/PID/cgroup writes it (``0::/path``)


@dataclass(frozen=True)
class Mount:
    """One cgroup mount of /proc/PID/mountinfo: the cgroup path it shows (``root``) and where (``point``)."""

    root: str
    point: str
    version: int  # 1 or 2
    controllers: frozenset  # v1: the controllers of that hierarchy (from the super options); v2: empty


def _unescape(field: str) -> str:
    """mountinfo writes a space, tab, newline and backslash in a path as octal escapes (``\\040``)."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1:i + 4].isdigit() and len(field[i + 1:i + 4]) == 3:
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> list[Mount]:
    """The cgroup mounts of a mountinfo text (fields: id, parent, dev, root, point, options, [optional...], -,
    fstype, source, super options)."""
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        sep = fields.index("-")
        if len(fields) < sep + 3 or len(fields) < 5:
            continue
        fstype = fields[sep + 1]
        if fstype not in ("cgroup", "cgroup2"):
            continue
        options = set(fields[sep + 3].split(",")) if len(fields) > sep + 3 else set()
        names = frozenset(o for o in options if o not in ("rw", "ro") and "=" not in o or o.startswith("name="))
        mounts.append(Mount(_unescape(fields[3]), _unescape(fields[4]), 2 if fstype == "cgroup2" else 1,
                            frozenset() if fstype == "cgroup2" else names))
    return mounts


def parse_cgroup(text: str) -> dict[str, str]:
    """controller -> cgroup path of a /proc/PID/cgroup text (``4:memory:/a/b``; a line may name several controllers,
    ``cpu,cpuacct``; the v2 line ``0::/path`` is under ``V2``)."""
    paths = {}
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        _, names, path = parts
        for name in (names.split(",") if names else [V2]):
            paths[name] = path
    return paths


def _read(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return None


def _under(root: str, path: str) -> bool:
    return root == "/" or path == root or path.startswith(root.rstrip("/") + "/")


def folders(controller: str, pid: int | str = "self", proc: str = "/proc", root: str = "/") -> list[str]:
    """The folders of ``pid``'s cgroup in ``controller``'s hierarchy (``V2``: the unified one), its own first, then
    each ancestor up to the mount's root; [] where that controller is not mounted. ``root`` is prepended to mount
    points (a fake tree in tests). A mount whose folder for the path is missing (a container without a cgroup
    namespace shows the host's path) yields the mount point itself: the container's own cgroup."""
    cg = _read(os.path.join(proc, str(pid), "cgroup"))
    mi = _read(os.path.join(proc, str(pid), "mountinfo"))
    if cg is None or mi is None:
        return []
    path = parse_cgroup(cg).get(controller)
    if path is None:
        return []
    version = 2 if controller == V2 else 1
    for mount in parse_mountinfo(mi):
        if mount.version != version or (version == 1 and controller not in mount.controllers):
            continue
        if not _under(mount.root, path):
            continue
        point = os.path.join(root, mount.point.lstrip("/"))
        rel = os.path.relpath(path, mount.root) if mount.root != "/" else path.lstrip("/")
        rel = "" if rel == "." else rel
        own = os.path.join(point, rel).rstrip("/") if rel else point
        if not os.path.isdir(own):
            return [point] if os.path.isdir(point) else []
        out = [own]
        while rel:
            rel = os.path.dirname(rel)
            out.append(os.path.join(point, rel).rstrip("/") if rel else point)
        return out
    return []


def _chain(controller: str, pid, proc: str, root: str) -> list[tuple[int, str]]:
    """(version, folder) of ``controller``: its v1 hierarchy's folders, then the unified hierarchy's (where the
    controller lives in a hybrid layout depends on the machine; a file missing in one is simply not read)."""
    return ([(1, f) for f in folders(controller, pid, proc, root)] if controller != V2 else []) + \
        [(2, f) for f in folders(V2, pid, proc, root)]


def _int(text: str | None) -> int | None:
    try:
        return int((text or "").strip())
    except ValueError:
        return None


def _field(text: str | None, name: str) -> int | None:
    """The value of line ``name N`` of a flat-keyed file (memory.events, memory.oom_control, cpu.stat)."""
    for line in (text or "").splitlines():
        key, _, value = line.partition(" ")
        if key == name:
            return _int(value)
    return None


def _write(path: str, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)
