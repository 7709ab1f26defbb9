"""The subject's own Landlock domain: no submission traces, signals or reaches the grader's processes.

Without a pid namespace (unprotected grading, where bubblewrap cannot run) the grader's kernel, its warm servers and
nbgrader are processes of the submission's own user, and Linux lets a process trace any other of its user: ``gdb -p``
then runs code in the grader kernel that decides the points, or in the warm server that forks every later student's
kernel. A process in a Landlock domain may trace only processes of its own domain (Landlock ABI 1, Linux 5.13), and
from ABI 6 (Linux 6.12) neither signal them nor connect to their abstract Unix sockets. Entering one needs no
privilege, and what it restricts of the file system here is only the making of block devices, which nobody needs:
the domain is for its process scoping. The subject enters it before any cell runs; everything it starts (the rank
server, ranks, torchrun, Ray) inherits it, so those still trace and signal one another.
"""
from __future__ import annotations

import ctypes
import functools
import os
import sys
from typing import NamedTuple

from lab_utils.processes import libc, set_no_new_privs

_CREATE_RULESET, _RESTRICT_SELF = 444, 446  # the same numbers on every architecture (added after the table merge)
_CREATE_RULESET_VERSION = 1 << 0
_ACCESS_FS_MAKE_BLOCK = 1 << 11
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1
NONE = 0  # no Landlock ABI


class Support(NamedTuple):
    version: int           # the kernel's Landlock ABI (NONE where there is none)
    why_not: str | None    # why there is none, or why the domain could not be entered


@functools.cache
def _syscall():
    syscall = libc().syscall
    syscall.restype = ctypes.c_long
    return syscall


def abi() -> Support:
    """What the kernel offers: asks, enters nothing."""
    if not sys.platform.startswith("linux"):
        return Support(NONE, "Landlock is Linux's")
    version = _syscall()(_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    if version < 1:
        return Support(NONE, f"Landlock is not available ({os.strerror(ctypes.get_errno())})")
    return Support(int(version), None)


def scope_self() -> Support:
    """Enter a Landlock domain (``why_not`` is None when entered). Irreversible, and it also sets no-new-privileges
    (no setuid program gains anything from here on). Safe between fork and exec once ``abi()`` has run in the
    parent (the C library is then open: nothing here loads or imports)."""
    version, why = abi()
    if not version:
        return Support(NONE, why)
    syscall = _syscall()
    fields = [_ACCESS_FS_MAKE_BLOCK]
    if version >= 6:  # handled_access_net (none), scoped
        fields += [0, _SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL]
    attr = (ctypes.c_uint64 * len(fields))(*fields)
    fd = syscall(_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)), ctypes.c_uint32(0))
    if fd < 0:
        return Support(NONE, f"landlock_create_ruleset: {os.strerror(ctypes.get_errno())}")
    try:
        if not set_no_new_privs():
            return Support(NONE, f"no_new_privs: {os.strerror(ctypes.get_errno())}")
        if syscall(_RESTRICT_SELF, ctypes.c_int(fd), ctypes.c_uint32(0)) != 0:
            return Support(NONE, f"landlock_restrict_self: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(fd)
    return Support(version, None)
