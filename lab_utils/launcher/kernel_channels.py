"""Student kernels on Unix sockets only their owner can reach: a Jupyter server extension, and the doctor's check.

A kernel's IOPub channel is a ZeroMQ PUB socket: it sends every cell's source and output to any subscriber, no key
asked. On jupyter_client's default transport (TCP ports of 127.0.0.1) every local user can subscribe, so on a shared
machine (the course's JupyterHub, ``make lab`` on a shared box) a classmate could read every cell a student runs.

Installing the course package (``pip install .``, the hub's venv; ``make install`` copies it for its editable install,
which setuptools leaves data files out of) puts ``jupyter-config/jupyter_server_config.d/dtlabs-kernels.json`` in
``<prefix>/etc/jupyter/``. It enables this module as a server extension (from that folder a server reads only
``jpserver_extensions``, no other setting), which has the server's kernels started by ``StudentKernelManager``:
jupyter_client's ``ipc`` transport, the five sockets beside the kernel's connection file in the Jupyter runtime folder
(0700, the user's). Where that path is too long for a socket address, or others can enter the folder, they go to a
0700 folder of their own under the temp folder. nbgrader's Validate button, which runs the student's notebook inside
this server with ``AsyncKernelManager`` on TCP whatever the config says, is given ``ValidateKernelManager`` (the same
sockets, a folder of its own). Only servers load extensions: nbclient, papermill and grading keep their own kernel
managers (grading's ``PrivateSocketKernelManager`` shares ``PrivateSockets``). ``--KernelManager.transport=tcp``, or a
config naming another kernel manager, undoes it.
"""
from __future__ import annotations

import json
import os
import shutil
import sys

from jupyter_client.manager import AsyncKernelManager
from jupyter_server.services.kernels.kernelmanager import ServerKernelManager
from traitlets import default

from lab_utils import tempdirs

UNIX_SOCKETS = sys.platform.startswith("linux") or sys.platform == "darwin"
MAX_SOCKET_PATH = 103 if sys.platform == "darwin" else 107  # bytes of sun_path, less its closing NUL
FOLDER_PREFIX = "dtlabs-sockets-"  # a kernel's own 0700 folder, where the runtime folder will not do
CONFIG = "jupyter-config/jupyter_server_config.d/dtlabs-kernels.json"  # what enables this extension, installed
WORRY = "any local user can subscribe to a kernel's IOPub without its key and read every cell run in it"


def private(folder: str) -> bool:
    """Whether only its owner, this user, can enter ``folder`` (a socket needs its folder searchable to connect)."""
    try:
        st = os.stat(folder)
    except OSError:
        return False
    return st.st_uid == os.geteuid() and not st.st_mode & 0o077


def why_not_beside(ip: str) -> str | None:
    """Why a kernel's sockets ``IP-1`` .. ``IP-5`` cannot go where jupyter_client puts them; None when they can."""
    if not os.path.isabs(ip):
        return "its socket path is relative"
    if len(os.fsencode(ip)) + 3 > MAX_SOCKET_PATH:  # "-1" .. "-99": ZeroMQ refuses a longer address, the kernel dies
        return f"a socket path there would exceed {MAX_SOCKET_PATH} bytes"
    if not private(os.path.dirname(ip)):
        return "others can enter that folder"
    return None


def _short_temp_folder() -> str:
    """The temp folder, unless its path leaves too little of a socket address's bytes for ZeroMQ: then /tmp."""
    import tempfile

    return tempfile.gettempdir() if len(tempfile.gettempdir().encode()) <= 60 else "/tmp"


class PrivateSockets:
    """A jupyter_client kernel manager's mixin (before the manager in the bases): the kernel on ``ipc`` where this
    class can have it, its sockets beside the connection file where that folder is private and the path short enough
    (``sockets_beside``), else in a 0700 folder of their own under the temp folder, removed with the kernel (or, where
    the process that made it was killed, at the next such kernel's start). Used by ``StudentKernelManager``,
    ``ValidateKernelManager`` and grading's ``PrivateSocketKernelManager``."""

    folder_prefix = FOLDER_PREFIX  # of a kernel's own folder
    ipc_here = UNIX_SOCKETS  # where ipc is the default transport
    sockets_beside = True  # whether jupyter_client's place for the sockets, beside the connection file, may do
    _folder: str | None = None

    @default("transport")
    def _transport_default(self) -> str:
        return "ipc" if self.ipc_here else "tcp"

    @default("ip")
    def _ip_default(self) -> str:
        ip = super()._ip_default()
        if self.transport != "ipc" or not self.ipc_here or (self.sockets_beside and not why_not_beside(ip)):
            return ip
        parent = _short_temp_folder()
        tempdirs.remove_orphaned_tempdirs(self.folder_prefix, parents=[parent])  # a killed process's
        self._folder = tempdirs.owned_tempdir(self.folder_prefix, dir=parent)
        return f"{self._folder}/k"  # the channels are k-1 .. k-5

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        await super()._async_cleanup_resources(restart=restart)
        if not restart and self._folder:
            shutil.rmtree(self._folder, ignore_errors=True)

    cleanup_resources = _async_cleanup_resources


class StudentKernelManager(PrivateSockets, ServerKernelManager):
    """The server's kernel manager, on ``ipc`` where there are Unix sockets (Linux, macOS), in a private folder."""


class ValidateKernelManager(PrivateSockets, AsyncKernelManager):
    """The kernel manager of nbgrader's Validate button in a server with this extension (``private_validation``)."""


def private_validation() -> bool | None:
    """Have nbgrader's ``Execute`` (its Validate button, run by its server extension inside this server) start kernels
    with ``ValidateKernelManager``. True when it does (now or already); False when nbgrader's name is something else
    already (left alone); None without nbgrader."""
    import importlib.util

    if importlib.util.find_spec("nbgrader") is None:
        return None
    from nbgrader.preprocessors import execute

    if execute.AsyncKernelManager is not AsyncKernelManager:
        return execute.AsyncKernelManager is ValidateKernelManager
    # Execute.__init__ does kwargs.setdefault("kernel_manager_class", AsyncKernelManager), reading this module global
    # at call time: jupyter_client's manager on TCP loopback ports, where a classmate could subscribe to IOPub and read
    # every cell validated. No config can change it (an explicit kwarg beats config; Validator.preprocessors is not
    # configurable), so the name itself is rebound.
    execute.AsyncKernelManager = ValidateKernelManager
    return True


def adopt(mapping) -> bool:
    """Have the server's kernel manager start kernels with ``StudentKernelManager``, unless its config names a kernel
    manager class of its own (a gateway's remote kernels, a deployment's)."""
    from traitlets.utils.importstring import import_item

    if import_item(mapping.kernel_manager_class) is not ServerKernelManager:
        return False
    mapping.kernel_manager_class = f"{__name__}.{StudentKernelManager.__name__}"  # jupyter_client remakes its factory
    return True


def _jupyter_server_extension_points():
    return [{"module": __name__}]


def _load_jupyter_server_extension(serverapp) -> None:
    """Loaded after the server made its kernel manager and before it serves: no kernel has started yet."""
    if adopt(serverapp.kernel_manager):
        serverapp.log.info(f"dtlabs: kernels on Unix sockets only this user can reach ({__name__})")
    else:
        serverapp.log.warning(f"dtlabs: the config names its kernel manager class, "
                              f"{serverapp.kernel_manager.kernel_manager_class}: kernels are left as it says")
    validation = private_validation()
    if validation:
        serverapp.log.info(f"dtlabs: nbgrader's Validate button runs notebooks on Unix sockets only this user can "
                           f"reach ({__name__}.{ValidateKernelManager.__name__})")
    elif validation is False:
        from nbgrader.preprocessors import execute

        serverapp.log.warning(f"dtlabs: nbgrader's Validate button starts kernels with {execute.AsyncKernelManager}, "
                              "not jupyter_client's AsyncKernelManager: left as it is")


def server_kernel_manager():
    """The kernel manager a Jupyter server started here would give a new kernel: its config files loaded as it
    loads them, this extension adopting its kernel manager where they enable it; nothing started, no folder made."""
    import uuid

    from jupyter_core.paths import jupyter_runtime_dir
    from jupyter_server.extension.config import ExtensionConfigManager
    from jupyter_server.gateway.gateway_client import GatewayClient
    from jupyter_server.serverapp import ServerApp
    from traitlets.utils.importstring import import_item

    app = ServerApp()
    app.load_config_file()
    app.gateway_config = GatewayClient(parent=app)  # what the server's default kernel manager class depends on
    enabled = ExtensionConfigManager(read_config_path=app.config_file_paths).get_jpserver_extensions()
    enabled.update(app.jpserver_extensions)  # the config files' own entries win, as in the server
    mapping = app.kernel_manager_class(parent=app, log=app.log)
    if enabled.get(__name__):
        adopt(mapping)
    connection_file = os.path.join(jupyter_runtime_dir(), f"kernel-{uuid.uuid4()}.json")
    return import_item(mapping.kernel_manager_class)(parent=mapping, log=app.log, connection_file=connection_file)


def _folder_words(folder: str) -> str:
    try:
        st = os.stat(folder)
    except OSError:
        return "not made yet: the server makes it 0700"
    owner = "yours" if st.st_uid == os.geteuid() else f"uid {st.st_uid}'s"
    return f"mode {st.st_mode & 0o7777:04o}, {owner}" + ("" if private(folder) else ": OTHERS CAN ENTER")


def report(out=print) -> list[str]:
    """The doctor's lines: the transport of the kernels a JupyterLab here starts, their runtime folder, and, inside
    a kernel, this kernel's own. Returns the problems (another local user could subscribe)."""
    from jupyter_core.paths import jupyter_runtime_dir

    problems, warnings = [], []
    km = server_kernel_manager()
    runtime = jupyter_runtime_dir()
    if km.transport == "ipc":
        why = why_not_beside(os.path.splitext(km.connection_file)[0] + "-ipc")
        where = f"a 0700 folder of each kernel's own in {_short_temp_folder()} ({why})" if why and isinstance(
            km, StudentKernelManager) else "the runtime folder"
        out(f"kernels     ipc: Unix sockets in {where} ({type(km).__name__})")
        if why and not isinstance(km, StudentKernelManager):
            problems.append(f"kernels put their sockets in the runtime folder, but {why}")
    else:
        out(f"kernels     tcp: ports of 127.0.0.1 ({type(km).__name__})")
        warnings.append(f"JupyterLab's kernels listen on TCP: {WORRY}")
        if UNIX_SOCKETS and isinstance(km, StudentKernelManager):
            problems.append("JupyterLab's kernels listen on TCP: your Jupyter config sets KernelManager.transport=tcp; "
                            "remove it")
        elif UNIX_SOCKETS:
            problems.append(f"JupyterLab's kernels listen on TCP: the server extension {__name__} is off; put the "
                            f"course's {CONFIG} in {sys.prefix}/etc/jupyter/jupyter_server_config.d/ (`pip install .` "
                            "and `make install` do) and let no config disable it")
        else:
            warnings.append("this system has no Unix sockets for ZeroMQ's ipc: a shared machine is not private here")
    out(f"runtime     {runtime} ({_folder_words(runtime)})")
    mine = _this_kernel()
    if mine:
        if mine.get("transport") == "ipc":
            folder = os.path.dirname(mine["ip"])
            out(f"this kernel ipc: {mine['ip']}-* ({_folder_words(folder)})")
            if not private(folder):
                problems.append(f"this kernel's sockets are in {folder}, which others can enter")
        else:
            out(f"this kernel tcp: ports of {mine.get('ip')}")
            warnings.append(f"this kernel listens on TCP: {WORRY}")
            problems.append("this kernel listens on TCP: restart it from a JupyterLab whose `dtlabs doctor` says ipc")
    for w in warnings:
        out(f"WARNING     {w}")
    return problems


def _this_kernel() -> dict | None:
    """This kernel's connection info, when this process is one."""
    if "ipykernel" not in sys.modules:
        return None
    try:
        from ipykernel.connect import get_connection_file

        with open(get_connection_file()) as fh:
            return json.load(fh)
    except (RuntimeError, OSError, ValueError):
        return None
