"""Run a command where namespaces are refused the way Docker's default seccomp profile refuses them to a container
without CAP_SYS_ADMIN: ``clone`` with a namespace flag, ``unshare``, ``setns``, ``mount`` and ``pivot_root`` fail with
EPERM and ``clone3`` with ENOSYS (so that libc falls back to ``clone``), for the command and every process it starts.
bubblewrap then cannot build a sandbox, as in Gradescope's autograder containers, even for root.

    python tests/helpers/no_namespaces.py COMMAND [ARG ...]

Needs libseccomp (Debian's libseccomp2) and the ``pyseccomp`` binding (the test extra).
"""
from __future__ import annotations

import errno
import os
import sys

def refuse_namespaces() -> None:
    """Load the filter into this process; it is inherited by every child and survives exec."""
    import pyseccomp as seccomp

    f = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
    # CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET: the flags Docker's profile masks
    for flag in (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000):
        f.add_rule(seccomp.ERRNO(errno.EPERM), "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
    for call in ("unshare", "setns", "mount", "umount2", "pivot_root"):
        f.add_rule(seccomp.ERRNO(errno.EPERM), call)
    f.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
    f.load()


if __name__ == "__main__":
    refuse_namespaces()
    os.execvp(sys.argv[1], sys.argv[1:])
