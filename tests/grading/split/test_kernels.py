"""Kernels on private sockets (lab_utils.grading.split.kernels): no TCP port for another process to take before the
kernel binds it (a ``dtlabs validate`` lost to "Address already in use"), nothing left behind."""
from __future__ import annotations

import json
import os

import nbformat
import psutil
import pytest
from nbclient import NotebookClient

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

    def on_cell_executed(cell, cell_index, execute_reply):
        kernel = psutil.Process(json.loads(cell.outputs[0]["text"])["pid"])
        held.update(c.laddr for c in kernel.net_connections(kind="unix"))

    client = NotebookClient(nb, timeout=120, kernel_name="python3", kernel_manager_class=PrivateSocketKernelManager,
                            on_cell_executed=on_cell_executed, resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    info = json.loads(nb.cells[0].outputs[0]["text"])
    if kernels.ABSTRACT_SOCKETS:
        assert info["transport"] == "ipc" and info["ip"].startswith("@dtlabs-kernel-"), info
        channels = {f"{info['ip']}-{info[f'{name}_port']}" for name in ("shell", "iopub", "stdin", "control", "hb")}
        assert len(channels) == 5 and channels <= held, (
            f"the kernel's five channels {sorted(channels)} are not all among the sockets it holds {sorted(held)}")
    else:
        assert info["transport"] == "tcp", info
    assert sorted(os.listdir(tmp_path)) == [], "the kernel left files behind"


def test_two_kernel_managers_never_share_socket_names():
    a, b = PrivateSocketKernelManager(), PrivateSocketKernelManager()
    assert a.ip != b.ip
