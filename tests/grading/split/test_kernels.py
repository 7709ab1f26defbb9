"""Kernels on private sockets (lab_utils.grading.split.kernels): no TCP port for another process to take before the
kernel binds it (a ``dtlabs validate`` lost to "Address already in use"), nothing left behind."""
from __future__ import annotations

import json
import os

import nbformat
import psutil
import pytest
from nbclient import NotebookClient

from helpers import nobody
from lab_utils.grading.split import kernels
from lab_utils.grading.split.execute import SplitExecute
from lab_utils.grading.quality.swaps import SwapSession
from lab_utils.grading.split.kernels import PrivateSocketKernelManager

PROBE = ("import json, os\n"
         "from ipykernel import get_connection_info\n"
         "print(json.dumps({'pid': os.getpid(), **json.loads(get_connection_info())}))")


def test_every_grading_executor_starts_its_kernel_on_private_sockets():
    for executor in (SplitExecute, SwapSession):  # autograde, validate, the answer-swap sessions
        assert executor().kernel_manager_class is PrivateSocketKernelManager, (
            f"{executor.__name__} would start its kernel on TCP ports jupyter_client picked and released: another "
            "process can bind one first, and the kernel dies before it answers")


@pytest.mark.slow
def test_a_kernel_on_private_sockets_binds_its_channels_there_and_leaves_no_file(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # jupyter_client's connection file goes here and must go away
    monkeypatch.chdir(tmp_path)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(PROBE)])
    held = set()  # the Unix socket names the kernel holds while it runs
    folder_modes = {}  # its socket folder's mode, while it runs

    def on_cell_executed(cell, cell_index, execute_reply):
        info = json.loads(cell.outputs[0]["text"])
        kernel = psutil.Process(info["pid"])
        held.update(c.laddr for c in kernel.net_connections(kind="unix"))
        folder = os.path.dirname(info["ip"])
        if os.path.isdir(folder):
            folder_modes[folder] = os.stat(folder).st_mode & 0o7777

    client = NotebookClient(nb, timeout=120, kernel_name="python3", kernel_manager_class=PrivateSocketKernelManager,
                            on_cell_executed=on_cell_executed, resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    info = json.loads(nb.cells[0].outputs[0]["text"])
    if kernels.IPC_SOCKETS:
        folder = os.path.dirname(info["ip"])
        assert info["transport"] == "ipc" and os.path.basename(folder).startswith(kernels.FOLDER_PREFIX), info
        assert folder_modes[folder] == 0o700, f"the kernel's socket folder is {oct(folder_modes[folder])}, not 0700"
        channels = {f"{info['ip']}-{info[f'{name}_port']}" for name in ("shell", "iopub", "stdin", "control", "hb")}
        assert len(channels) == 5 and channels <= held, (
            f"the kernel's five channels {sorted(channels)} are not all among the sockets it holds {sorted(held)}")
        assert not os.path.exists(folder), "the kernel's socket folder outlived it"
    else:
        assert info["transport"] == "tcp", info
    assert sorted(os.listdir(tmp_path)) == [], "the kernel left files behind"


def test_two_kernel_managers_never_share_socket_names():
    a, b = PrivateSocketKernelManager(), PrivateSocketKernelManager()
    assert a.ip != b.ip


def _heard_by_another_user(manager_class, tmp_path) -> dict:
    """What user ``nobody`` hears, from every socket and loopback port it can reach, while a kernel of
    ``manager_class`` prints a secret for a few seconds."""
    import secrets

    if nobody.why_not():
        pytest.skip(nobody.why_not())
    secret = f"dtlabs-secret-{secrets.token_hex(8)}"
    code = f"import time\nfor _ in range(30):\n    print({secret!r}, flush=True)\n    time.sleep(0.1)\n"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
    listener = {}

    def on_cell_execute(cell, cell_index):
        listener["proc"] = nobody.eavesdrop(2, secret)

    client = NotebookClient(nb, timeout=120, kernel_name="python3", kernel_manager_class=manager_class,
                            on_cell_execute=on_cell_execute, resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    heard = nobody.heard(listener["proc"])
    assert secret in nb.cells[0].outputs[0]["text"]
    return heard


@pytest.mark.slow
def test_another_user_hears_nothing_of_a_kernel_on_private_sockets(tmp_path):
    """IOPub publishes to any subscriber without a key: every cell's source (execute_input) and output, hidden
    tests included under grading. On private sockets no other local user can connect to any channel."""
    heard = _heard_by_another_user(PrivateSocketKernelManager, tmp_path)
    assert heard["uid"] == 65534 and not heard["heard"], heard


@pytest.mark.slow
def test_the_eavesdropper_hears_a_kernel_on_tcp(tmp_path):
    """The control: the same listener hears a kernel on jupyter_client's default transport (loopback TCP), so its
    silence above is the transport's doing."""
    from jupyter_client.manager import AsyncKernelManager

    heard = _heard_by_another_user(AsyncKernelManager, tmp_path)
    assert heard["heard"], f"the listener heard nothing of a kernel on TCP: {heard}"
