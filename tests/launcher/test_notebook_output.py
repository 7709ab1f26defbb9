"""In a real Jupyter kernel: a function defined in a cell runs on the ranks, and their output and errors
arrive in that cell."""
from __future__ import annotations

import nbformat
from nbclient import NotebookClient

from lab_utils.launcher.backend import choose_backend
from lab_utils.grading.split.kernels import PrivateSocketKernelManager

CELLS = [
    "from lab_utils import launch",
    "import torch, torch.distributed as dist\n"
    "def greet(scale):\n"
    "    t = torch.ones(2) * (dist.get_rank() + 1)\n"
    "    dist.all_reduce(t)\n"
    "    print(f'hello from rank {dist.get_rank()}: {t.tolist()}')\n"
    "    return float(t.sum()) * scale\n"
    "results = launch(greet, world_size=2, args=(10,))\n"
    "print('results', results)",
    "def broken():\n"
    "    if dist.get_rank() == 1:\n"
    "        raise KeyError('missing shard')\n"
    "    dist.barrier()\n"
    "launch(broken, world_size=2, timeout=30)",
]


def _run(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in CELLS]
    client = NotebookClient(nb, timeout=120, kernel_name="python3", allow_errors=True,
                            kernel_manager_class=PrivateSocketKernelManager,
                            resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    return nb


def _text(cell, name=None):
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream" and name in (None, o.name))


def test_cell_defined_function_streams_rank_output_into_the_cell(tmp_path):
    nb = _run(tmp_path)
    out = _text(nb.cells[1], "stdout")
    assert f"[launch] 2 ranks, {choose_backend(2, 'auto').reason}" in out  # the code's own choice, not this machine's
    assert "[rank 0] hello from rank 0: [3.0, 3.0]" in out
    assert "[rank 1] hello from rank 1: [3.0, 3.0]" in out
    assert "results [60.0, 60.0]" in out

    err = [o for o in nb.cells[2].outputs if o.output_type == "error"]
    assert len(err) == 1 and err[0].ename == "RankFailedError"
    message = err[0].evalue
    assert message.startswith("rank 1 raised KeyError: 'missing shard'")
    assert "Cell In[3], line 3, in broken" in message  # the cell and line, as IPython numbers them
    assert "raise KeyError('missing shard')" in message
