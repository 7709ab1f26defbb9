"""The kernel provisioner of the course's notebook executors: grader kernels forked warm, else started cold, saying why.

``WarmKernelProvisioner`` is jupyter_client's ``LocalProvisioner`` with one change: ``launch_kernel`` asks a warm
server (``lab_utils.warm``) to fork the kernel instead of running ``python -m ipykernel_launcher``.
Everything else (interrupts and kills sent to the kernel's process group, restarts, waiting, the connection file)
is ``LocalProvisioner``'s, on a process object that behaves as its ``Popen``. It is registered as the entry point
``dtlabs-warm`` (group ``jupyter_client.kernel_provisioners``) and chosen only by
``PrivateSocketKernelManager`` (grading, ``dtlabs validate``, the answer swaps, the tests' notebook runs) while
``c.DTLabs.warm_kernels`` is on: a student's kernel in JupyterLab is started as it always was.

A kernel starts cold where the warm server cannot serve it (another interpreter or kernel command, another import
environment, a server that could not start or import); the log says why, once per reason, and ``dtlabs doctor``
says whether this machine's kernels start warm.
"""
from __future__ import annotations

import os
import sys
from typing import Any

from jupyter_client.connect import KernelConnectionInfo
from jupyter_client.provisioning import LocalProvisioner

from lab_utils import warm

NAME = "dtlabs-warm"
_SAID: set = set()


def why_cold(cmd: list, config=None) -> str | None:
    """Why a kernel with command ``cmd`` would start cold under ``config`` (the course's c.DTLabs; None: it can
    start warm)."""
    from lab_utils import settings

    if not settings.load(config).warm_kernels:
        return "c.DTLabs.warm_kernels is off"
    if not sys.platform.startswith("linux"):
        return "forked kernels need Linux (/proc, PR_SET_PDEATHSIG)"
    from jupyter_client.provisioning import KernelProvisionerFactory

    if NAME not in KernelProvisionerFactory.instance().get_provisioner_entries():
        return f"the {NAME} kernel provisioner is not registered: reinstall the package (`pip install -e .`)"
    if len(cmd) < 3 or cmd[1:3] != ["-m", "ipykernel_launcher"]:
        return f"the kernel command is not `python -m ipykernel_launcher`: {' '.join(cmd[:3])}"
    if not os.path.isabs(cmd[0]):
        return f"the kernel's interpreter is not named by its path: {cmd[0]}"
    return None


class WarmKernelProvisioner(LocalProvisioner):
    """``LocalProvisioner``, with the kernel forked by a warm server where it can be (module docstring)."""

    warm = False  # whether the running kernel was forked warm (tests and doctor read it)
    cold_reason: str | None = None

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> KernelConnectionInfo:
        env = kwargs.get("env")
        env = dict(os.environ if env is None else env)
        env.pop(warm.ADDRESS_VAR, None)  # what runs in the kernel never asks the server for anything
        if not kwargs.get("independent"):
            env["JPY_PARENT_PID"] = str(os.getpid())  # as launch_kernel sets it; the kernel's poller then watches
        why = why_cold(cmd, self.config)
        if why is None:
            devnull = os.open(os.devnull, os.O_RDWR)  # stdin: launch_kernel gives a pipe it closes at once
            try:
                # a server on the kernel's own interpreter path (a kernel sees it as sys.executable, and hands it to
                # the processes it starts: tests/labs/test_labs.py's "My Courses" kernel)
                child = warm.fork(warm.KERNEL, cmd[3:], env, kwargs.get("cwd") or os.getcwd(), executable=cmd[0],
                                  fds=(devnull, _fd(kwargs.get("stdout"), 1, devnull),
                                       _fd(kwargs.get("stderr"), 2, devnull)))
            except warm.Refused as exc:
                why = str(exc)
                child = None
            finally:
                os.close(devnull)
            if child is not None:
                self.process, self.pid, self.pgid = child, child.pid, child.pid  # it leads its own session
                self.cwd = kwargs.get("cwd") or os.getcwd()
                self.warm, self.cold_reason = True, None
                return self.connection_info
        self.warm, self.cold_reason = False, why
        kwargs["env"] = env
        if why not in _SAID:
            _SAID.add(why)
            self.log.warning("dtlabs: this kernel starts cold: %s", why)
        return await super().launch_kernel(cmd, **kwargs)

    async def cleanup(self, restart: bool = False) -> None:
        if isinstance(self.process, warm.WarmChild):
            self.process.close()
        await super().cleanup(restart)


def _fd(stream, default: int, devnull: int) -> int:
    """The descriptor ``Popen`` would give the kernel for ``stream`` (None: this process's own)."""
    if stream is None:
        return default
    if stream == -3:  # subprocess.DEVNULL
        return devnull
    return stream if isinstance(stream, int) else stream.fileno()


def doctor_line() -> str:
    """``dtlabs doctor``'s line on grader kernels: warm (a kernel forked and ran here) or cold, and why."""
    import time

    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        cmd = KernelSpecManager().get_kernel_spec("python3").argv
    except NoSuchKernel:
        return "kernels     cold: no python3 kernel is installed here"
    if cmd and cmd[0] in ("python", f"python{sys.version_info[0]}", "python%i.%i" % sys.version_info[:2]):
        cmd = [sys.executable, *cmd[1:]]  # as jupyter_client's format_kernel_cmd runs its native kernel
    why = why_cold(cmd)
    if why is None:
        devnull = os.open(os.devnull, os.O_RDWR)
        start = time.perf_counter()
        try:
            child = warm.fork(warm.KERNEL, ["--version"], dict(os.environ), os.getcwd(),
                              fds=(devnull, devnull, devnull))
            code = child.wait(timeout=60)
            child.close()
            if code != 0:
                why = f"a kernel forked from the warm server exited with {code}"
        except (warm.Refused, OSError) as exc:
            why = str(exc)
        finally:
            os.close(devnull)
    if why is not None:
        return f"kernels     cold (each grader kernel starts a fresh interpreter): {why}"
    return (f"kernels     warm: grader kernels fork from a server that imported {len(warm.KERNEL.preload)} modules "
            f"(a forked ipykernel ran here in {time.perf_counter() - start:.2f} s, the server's start included)")
