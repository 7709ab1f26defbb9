"""Where Lab 11's kernels run: compiled on a CUDA GPU, else on the CPU in Triton's interpreter and numba's CUDA simulator.

The choice is made before triton and numba are imported (numba reads NUMBA_ENABLE_CUDASIM once, when ``numba.cuda``
is imported; Triton reads TRITON_INTERPRET when a kernel is decorated). Importing this module loads neither, so
nothing outside Lab 11 loads them (tests/labs/test_gpu_kernels.py); ``choose`` loads Triton's interpreter on a CPU to
bounds-check it.
"""
from __future__ import annotations

import os
import sys

COMPILED, INTERPRETER = "compiled", "interpreter"
_SWITCHES = ("TRITON_INTERPRET", "NUMBA_ENABLE_CUDASIM")
# Why numba's kernels run in the simulator on a CUDA machine, where they must ("" where they compile).
numba_simulated_because = ""


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
    global numba_simulated_because
    compiled = torch.cuda.is_available()
    for name in _SWITCHES:
        if compiled:
            os.environ.pop(name, None)
        else:
            os.environ[name] = "1"
    numba_simulated_because = _numba_cannot_compile() if compiled else ""
    if numba_simulated_because:
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    cuda_mod = sys.modules.get("numba.cuda")
    if cuda_mod is not None and _simulating(cuda_mod) != (not compiled or bool(numba_simulated_because)):
        raise RuntimeError("numba.cuda was imported before the kernel mode was chosen, in the other mode: restart the "
                           "kernel and run the setup cell first")
    if not compiled:
        guard_interpreter()
    return ("cuda", COMPILED) if compiled else ("cpu", INTERPRETER)


def guard_interpreter() -> None:
    """Make Triton's interpreter raise on a load or store outside every tensor the launch was given.

    On a GPU such an access is an illegal-address error (or silent garbage); the interpreter reads and writes the
    process's own memory instead, and a stray store corrupts the heap and aborts the process (seen: a kernel storing
    at negative offsets killed the notebook's kernel with SIGABRT). Masked-off lanes are not checked, as on a GPU.
    """
    import numpy as np
    from triton.runtime import interpreter

    if getattr(interpreter, "_dtlabs_guarded", False):
        return
    launch = {"ranges": []}

    def storages(arg, found):
        if isinstance(arg, (tuple, list)):
            for a in arg:
                storages(a, found)
        elif hasattr(arg, "untyped_storage"):
            storage = arg.untyped_storage()
            found.append((storage.data_ptr(), storage.data_ptr() + storage.nbytes()))
        elif hasattr(arg, "base"):  # a TensorDescriptor
            storages(arg.base, found)
        return found

    init_args = interpreter.GridExecutor._init_args_hst

    def init_args_recorded(self, args_dev, kwargs):
        args_hst, kwargs_hst = init_args(self, args_dev, kwargs)
        launch["ranges"] = storages([args_hst, list(kwargs_hst.values())], [])
        return args_hst, kwargs_hst

    def check(what, ptrs, mask, itemsize):
        addresses = np.asarray(ptrs.data).astype(np.uint64)
        active = np.broadcast_to(np.asarray(mask.data, dtype=bool), addresses.shape)
        inside = np.zeros(addresses.shape, dtype=bool)
        for lo, hi in launch["ranges"]:
            inside |= (addresses >= lo) & (addresses + itemsize <= hi)
        outside = active & ~inside
        if outside.any():
            raise IndexError(f"out-of-bounds {what}: {int(outside.sum())} of {int(active.sum())} unmasked lanes point "
                             "outside every tensor given to the kernel (check the offsets, the strides and the mask)")

    load, store = interpreter.InterpreterBuilder.create_masked_load, interpreter.InterpreterBuilder.create_masked_store

    def checked_load(self, ptrs, mask, other, *args, **kwargs):
        check("load", ptrs, mask, np.dtype(interpreter._get_np_dtype(ptrs.get_element_ty())).itemsize)
        return load(self, ptrs, mask, other, *args, **kwargs)

    def checked_store(self, ptrs, value, mask, *args, **kwargs):
        check("store", ptrs, mask, np.asarray(value.data).dtype.itemsize)
        return store(self, ptrs, value, mask, *args, **kwargs)

    interpreter.GridExecutor._init_args_hst = init_args_recorded
    interpreter.InterpreterBuilder.create_masked_load = checked_load
    interpreter.InterpreterBuilder.create_masked_store = checked_store
    interpreter._dtlabs_guarded = True


def _numba_cannot_compile() -> str:
    """With numba-cuda 0.30.4 and numpy 2.5.2: numba-cuda's compiler registers np.row_stack, which
    numpy 2.5 removed, and every kernel then fails to compile with AttributeError. The extra pins numpy<2.5; an
    environment that has numpy 2.5 anyway keeps Triton compiled and runs numba's kernels in the simulator."""
    import numpy as np

    if hasattr(np, "row_stack"):
        return ""
    return (f"numba-cuda cannot compile with numpy {np.__version__} (it uses np.row_stack, removed in numpy 2.5): "
            "numba's kernels run in the CUDA simulator; `pip install 'numpy<2.5'` compiles them")


def _simulating(cuda_mod) -> bool:
    return "simulator" in type(getattr(cuda_mod, "gpus", None)).__module__
