"""CS336 assignment 2's adapters (their ``assignment2-systems/tests/adapters.py``), answered by the course: the two
FlashAttention functions by Lab 11's solution, the three FSDP functions by Lab 03's, nothing else. ``run.sh`` puts
this file in place of theirs and runs their attention and FSDP tests (tests/labs/test_cs336.py runs it): the
attention on a CPU under Triton's interpreter or compiled on a GPU, the FSDP on 2 gloo ranks."""
from __future__ import annotations

import functools
import os
from pathlib import Path

# Lab 11's code: its parameters and setup (which choose the kernel mode), the PyTorch tiling and the answers.
ATTENTION_CELLS = ("parameters", "setup", "flash-torch", "flash_attention_forward", "flash_attention_backward",
                   "FlashAttention")
# Lab 03's: its parameters, the FSDP helpers and the class (the setup cell's imports are the preamble; the rest of
# that cell starts the lab's rank server, which CS336's own processes do not need).
FSDP_CELLS = ("parameters", "fsdp_scratch_helpers", "FSDP")
FSDP_PREAMBLE = "import math\n\nimport torch\nimport torch.distributed as dist\nimport torch.nn.functional as F\n"


def _solution(lab: str, cells, preamble: str = ""):
    """The solution's ``cells`` as a module, written beside this file (one per process: their FSDP test spawns
    ranks that each import it)."""
    import nbformat

    from lab_utils.grading.quality.build import solution_module

    source = Path(os.environ["DTLABS_COURSE"]) / "solutions" / lab / f"{lab}.ipynb"
    name = f"_{lab}_solution_{os.getpid()}"
    return solution_module(nbformat.read(str(source), as_version=4), cells, Path(__file__).with_name(f"{name}.py"),
                           name, preamble=preamble)


@functools.cache
def _lab():
    return _solution("11_gpu_kernels", ATTENTION_CELLS)


@functools.cache
def _lab03():
    return _solution("03_fsdp_zero", FSDP_CELLS, FSDP_PREAMBLE)


def get_flashattention_autograd_function_pytorch() -> type:
    """The lab's FlashAttention with its forward in PyTorch (``flash_forward_torch``, the tiled loop of section 4)."""
    lab = _lab()

    class FlashAttentionPytorch(lab.FlashAttention):
        @staticmethod
        def forward(ctx, q, k, v, is_causal=False):
            o, lse = lab.flash_forward_torch(q, k, v, is_causal)
            ctx.save_for_backward(q, k, v, o, lse)
            ctx.is_causal = is_causal
            return o

    return FlashAttentionPytorch


def get_flashattention_autograd_function_triton() -> type:
    """The lab's FlashAttention: the Triton forward (``flash_attention_forward``), the PyTorch backward."""
    return _lab().FlashAttention


def get_fsdp(module, compute_dtype=None):
    """Lab 03's ``FSDP``: each Linear and Embedding sharded flat, the rest replicated; ``compute_dtype`` for the
    gathered weights, fp32 master weights and gradients."""
    return _lab03().FSDP(module, compute_dtype=compute_dtype)


def fsdp_on_after_backward(fsdp_model, optimizer) -> None:
    fsdp_model.finish_gradient_synchronization()


def fsdp_gather_full_params(fsdp_model) -> dict:
    return fsdp_model.gather_full_params()
