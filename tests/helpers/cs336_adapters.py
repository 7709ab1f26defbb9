"""Stanford CS336 assignment 2's FSDP adapters (``assignment2-systems/tests/adapters.py``), answered by Lab 03's ``FSDP``.

The class is read from the solution notebook (its parameters, helper and ``FSDP`` cells, run in this module's
namespace), so CS336's tests judge exactly the code the lab grades. tests/labs/test_cs336_fsdp.py runs their tests with this
module in place of their adapters.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

NOTEBOOK = Path(__file__).resolve().parents[2] / "solutions" / "03_fsdp_zero" / "03_fsdp_zero.ipynb"
CELLS = ("parameters", "fsdp_scratch_helpers", "FSDP")  # nbgrader grade_ids, in notebook order


def _load() -> dict:
    cells = {c.get("metadata", {}).get("nbgrader", {}).get("grade_id"): "".join(c["source"])
             for c in json.loads(NOTEBOOK.read_text())["cells"]}
    namespace = {"__name__": __name__, "math": math, "torch": torch, "dist": dist, "F": F}
    for grade_id in CELLS:
        exec(compile(cells[grade_id], f"{NOTEBOOK.name}:{grade_id}", "exec"), namespace)  # noqa: S102
    return namespace


FSDP = _load()["FSDP"]


def get_fsdp(module: torch.nn.Module, compute_dtype: torch.dtype | None = None) -> torch.nn.Module:
    return FSDP(module, compute_dtype=compute_dtype)


def fsdp_on_after_backward(fsdp_model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    fsdp_model.finish_gradient_synchronization()


def fsdp_gather_full_params(fsdp_model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return fsdp_model.gather_full_params()
