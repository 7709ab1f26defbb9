"""Kernels that talk over private Unix sockets, so no other process can take their ports first.

jupyter_client picks a kernel's five TCP ports by binding port 0 and closing the socket; the kernel binds them
a second or more later. On a loaded machine another process can take one of those ports in between (gloo and
TCPStore bind ephemeral ports all the time here), and the kernel dies with "Address already in use" before it
replies to kernel_info: a grade, a ``dtlabs validate`` or a papermill run lost to a race.

``PrivateSocketKernelManager`` uses ZeroMQ's ``ipc`` transport on Linux's abstract socket namespace
(``ipc://@dtlabs-kernel-<uuid>-N``): a name no one else picks, nothing on disk to clean up or leak, and not
reachable from a sandbox with its own network namespace (the grading subject). Elsewhere it is a plain
``AsyncKernelManager`` on TCP. Every notebook executor of the course uses it: grading (``SplitExecute``),
``dtlabs validate``, the answer-swap sessions, and the tests' papermill and nbclient runs.
"""
from __future__ import annotations

import sys
import uuid

from jupyter_client.manager import AsyncKernelManager
from traitlets import default

ABSTRACT_SOCKETS = sys.platform.startswith("linux")


class PrivateSocketKernelManager(AsyncKernelManager):
    """An ``AsyncKernelManager`` whose kernel listens on abstract Unix sockets named for this kernel alone."""

    @default("transport")
    def _transport_default(self) -> str:
        return "ipc" if ABSTRACT_SOCKETS else "tcp"

    @default("ip")
    def _ip_default(self) -> str:
        if self.transport == "ipc" and ABSTRACT_SOCKETS:
            # '@' puts the name in the abstract namespace: jupyter_client's existence check finds no file, so
            # the ports are 1..5, and the names are unique through the uuid.
            return f"@dtlabs-kernel-{uuid.uuid4().hex}"
        return super()._ip_default()
