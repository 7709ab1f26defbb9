"""Where Lab 11's kernels run: compiled on a CUDA GPU, else on the CPU in Triton's interpreter and numba's CUDA simulator.

The choice is made before triton and numba are imported (numba reads NUMBA_ENABLE_CUDASIM once, when ``numba.cuda``
is imported; Triton reads TRITON_INTERPRET when a kernel is decorated). This module imports neither, so nothing
outside Lab 11 loads them (tests/test_layers.py).
"""
from __future__ import annotations

import os
import sys

COMPILED, INTERPRETER = "compiled", "interpreter"
_SWITCHES = ("TRITON_INTERPRET", "NUMBA_ENABLE_CUDASIM")


def choose() -> tuple[str, str]:
    """``(device, mode)``: ``("cuda", "compiled")`` where torch sees a CUDA device, else ``("cpu", "interpreter")``,
    with both interpreters switched on. Call it before the first ``import triton`` / ``from numba import cuda``."""
    import importlib.util

    import torch

    missing = [m for m in ("triton", "numba_cuda") if importlib.util.find_spec(m) is None]
    if missing:
        raise ModuleNotFoundError(
            f"Lab 11 needs the optional kernels extra ({', '.join(missing)} not installed): `make install` installs it "
            "where Triton has wheels (Linux x86_64/aarch64), or pip install -c <a file with torch==YOUR_VERSION> "
            "-e '.[kernels]' in the course's folder")
    compiled = torch.cuda.is_available()
    for name in _SWITCHES:
        if compiled:
            os.environ.pop(name, None)
        else:
            os.environ[name] = "1"
    cuda_mod = sys.modules.get("numba.cuda")
    if cuda_mod is not None and _simulating(cuda_mod) == compiled:
        raise RuntimeError("numba.cuda was imported before the kernel mode was chosen, in the other mode: restart the "
                           "kernel and run the setup cell first")
    return ("cuda", COMPILED) if compiled else ("cpu", INTERPRETER)


def _simulating(cuda_mod) -> bool:
    return "simulator" in type(getattr(cuda_mod, "gpus", None)).__module__
