"""Kernels that talk over private Unix sockets, so no other process can take their ports first.

jupyter_client picks a kernel's five TCP ports by binding port 0 and closing the socket; the kernel binds them
a second or more later. On a loaded machine another process can take one of those ports in between (gloo and
TCPStore bind ephemeral ports all the time here), and the kernel dies with "Address already in use" before it
replies to kernel_info: a grade, a ``dtlabs validate`` or a papermill run lost to a race.

``PrivateSocketKernelManager`` uses ZeroMQ's ``ipc`` transport: Unix socket files in a folder of this user's alone
(mode 0700, ``tempdirs.owned_tempdir``), so no port is picked before it is bound, and no other user can connect to a
channel, IOPub included, whose subscribers need no key (abstract socket names and loopback ports are open to every
local user: a classmate or another job on the machine would read every hidden test a grading executes). The
folder goes with the kernel (``cleanup_resources``), or where the process that made it was killed, with the next
kernel's start. Elsewhere than Linux it is a plain ``AsyncKernelManager`` on TCP. Every notebook executor of the course
uses it: grading (``SplitExecute``), ``dtlabs validate``, the answer-swap sessions, and the tests' papermill and
nbclient runs.

Its kernels are provisioned by ``dtlabs-warm`` (``lab_utils.grading.split.provisioner``: forked from a warm server)
while ``c.DTLabs.warm_kernels`` is on; kernels JupyterLab starts for a student never use this manager.
"""
from __future__ import annotations

import sys

from jupyter_client.manager import AsyncKernelManager

from lab_utils import settings
from lab_utils.launcher.kernel_channels import PrivateSockets

IPC_SOCKETS = sys.platform.startswith("linux")
FOLDER_PREFIX = "dtlabs-kernel-"  # a kernel's private folder (0700) with its five sockets


class PrivateSocketKernelManager(PrivateSockets, AsyncKernelManager):
    """An ``AsyncKernelManager`` whose kernel listens on Unix socket files in a folder of this user's alone (the
    launcher's ``PrivateSockets``: here always a folder of the kernel's own, and ``ipc`` on Linux only)."""

    folder_prefix = FOLDER_PREFIX
    ipc_here = IPC_SOCKETS
    sockets_beside = False

    @property
    def kernel_spec(self):
        """The kernel's spec, with the warm provisioner unless the spec names its own or warm kernels are off."""
        spec = super().kernel_spec
        if spec is not None and "kernel_provisioner" not in spec.metadata and settings.load(self.config).warm_kernels:
            from jupyter_client.provisioning import KernelProvisionerFactory

            from lab_utils.grading.split.provisioner import NAME

            plain = spec.metadata
            spec.metadata = {**plain, "kernel_provisioner": {"provisioner_name": NAME}}
            # an install that predates the entry point (pip install -e . registers it): jupyter_client warns, cold
            if not KernelProvisionerFactory.instance(parent=self.parent).is_provisioner_available(spec):
                spec.metadata = plain
        return spec

