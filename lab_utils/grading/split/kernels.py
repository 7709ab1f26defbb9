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

Its kernels are provisioned by ``dtlabs-warm`` (``lab_utils.grading.split.provisioner``: forked from a warm server)
while ``c.DTLabs.warm_kernels`` is on; kernels JupyterLab starts for a student never use this manager.
"""
from __future__ import annotations

import sys
import uuid

from jupyter_client.manager import AsyncKernelManager
from traitlets import default

from lab_utils import settings

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
