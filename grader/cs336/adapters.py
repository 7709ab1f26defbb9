"""CS336 assignment 2's attention tests (stanford-cs336/assignment2-systems/tests/test_attention.py) against Lab 11's
solution: their ``assignment2-systems/tests/adapters.py`` for the two FlashAttention functions, nothing else.
``run.sh`` copies their test file beside this one and runs it: on a CPU under Triton's interpreter, on a GPU
compiled."""
from __future__ import annotations

import functools
import os
import tempfile
from pathlib import Path

# The lab's code: its parameters and setup (which choose the kernel mode), the PyTorch tiling and the answers.
CELLS = ("parameters", "setup", "flash-torch", "flash_attention_forward", "flash_attention_backward", "FlashAttention")


@functools.cache
def _lab():
    import nbformat

    from lab_utils.grading.quality.build import solution_module

    source = Path(os.environ["DTLABS_COURSE"]) / "solutions" / "11_gpu_kernels" / "11_gpu_kernels.ipynb"
    path = Path(tempfile.mkdtemp(prefix="lab11-cs336-")) / "lab11_solution.py"
    return solution_module(nbformat.read(str(source), as_version=4), CELLS, path, "lab11_solution")


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
