"""Lab 11's optional kernels extra (``pip install .[kernels]``: Triton, numba, numba-cuda) and its two paths.

On a CPU the lab's kernels run in Triton's interpreter and numba's CUDA simulator; tests/labs/test_labs.py proves that
path like every lab's (papermill, the swap session, known-wrong answers, mutants). The tests marked ``gpu`` compile
the solution's kernels for real on a CUDA device and compare them with torch at sizes the interpreter could not
run; the mode they expect is the one ``lab_utils.labkit.kernelmode`` chooses, and they skip with the reason where
there is no CUDA device or no Triton.
"""
from __future__ import annotations

import importlib.util
import json
import math
import platform
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAB = "11_gpu_kernels"
SOURCE = ROOT / "solutions" / LAB / f"{LAB}.ipynb"
KERNEL_MODULES = ("triton", "numba", "numba_cuda")
# The Makefile installs the extra where Triton has wheels (and KERNELS=0 was not asked for).
PLATFORM_ALLOWS = platform.system() == "Linux" and platform.machine() in ("x86_64", "aarch64") and \
    sys.version_info < (3, 15)
# The cells that define the lab's code: its parameters, setup, answers and the course's helpers (no demo, no test).
CODE_CELLS = ("parameters", "setup", "roofline", "grid", "launch-recorder", "softmax", "matmul", "flash-torch",
              "flash_attention_forward", "flash-reference", "flash_attention_backward", "FlashAttention", "benchmark")


def test_lab_utils_imports_no_kernel_compiler():
    """Triton and numba are Lab 11's alone: importing the course package (kernelmode included) loads neither."""
    code = ("import sys, lab_utils, lab_utils.launcher.launch, lab_utils.labkit.checks, lab_utils.labkit.data, "
            "lab_utils.labkit.models, lab_utils.labkit.kernelmode, lab_utils.grading.split.proxy;"
            f"print([m for m in {KERNEL_MODULES!r} if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]", f"importing lab_utils loaded {out}: keep triton and numba inside Lab 11's cells"


def test_no_other_lab_imports_a_kernel_compiler():
    for nb_path in sorted((ROOT / "solutions").glob("*/*.ipynb")):
        if nb_path.parent.name == LAB:
            continue
        text = "\n".join("".join(c["source"]) for c in json.loads(nb_path.read_text())["cells"])
        found = [m for m in ("import triton", "from triton", "import numba", "from numba") if m in text]
        assert not found, f"{nb_path.parent.name} uses {found}: the kernels extra is optional and Lab 11's alone"


@pytest.mark.parametrize("module", KERNEL_MODULES)
def test_kernels_extra_is_installed_where_the_platform_allows(module):
    if not PLATFORM_ALLOWS:
        pytest.skip(f"no Triton wheels for {platform.system()} {platform.machine()} Python "
                    f"{sys.version_info.major}.{sys.version_info.minor}: the Makefile leaves the kernels extra out")
    assert importlib.util.find_spec(module) is not None, (
        f"{module} is missing: `make install` installs `.[kernels]` on this platform (KERNELS=0 leaves it out, "
        "and Lab 11's setup cell then says so)")


def test_kernel_mode_follows_the_device():
    """Without CUDA both interpreters are switched on before triton and numba are imported; with CUDA, off."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("the kernels extra is not installed here")
    code = ("import os, json, torch\nfrom lab_utils.labkit import kernelmode\nchoice = kernelmode.choose()\n"
            "from numba import cuda\nprint(json.dumps([choice, torch.cuda.is_available(), "
            "os.environ.get('TRITON_INTERPRET'), os.environ.get('NUMBA_ENABLE_CUDASIM'), "
            "'simulator' in type(cuda.gpus).__module__, kernelmode.numba_simulated_because]))")
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("TRITON_INTERPRET", "NUMBA_ENABLE_CUDASIM")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    (device, mode), has_cuda, triton_switch, numba_switch, simulating, why = json.loads(
        out.stdout.strip().splitlines()[-1])
    if has_cuda and why:  # numba-cuda cannot compile in this environment: numba alone falls back to the simulator
        assert (device, mode, triton_switch, numba_switch, simulating) == ("cuda", "compiled", None, "1", True)
    elif has_cuda:
        assert (device, mode, triton_switch, numba_switch, simulating) == ("cuda", "compiled", None, None, False)
    else:
        assert (device, mode, triton_switch, numba_switch, simulating) == ("cpu", "interpreter", "1", "1", True)


GUARD_PROBE = """
import torch
from lab_utils.labkit import kernelmode
kernelmode.choose()
import triton, triton.language as tl

@triton.jit
def shift(x, out, n, step, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    tl.store(out + offsets * step, tl.load(x + offsets, mask=offsets < n, other=0.0))

x, out = torch.arange(8.0), torch.zeros(8)
shift[(1,)](x, out, 8, 1, BLOCK=8)
assert torch.equal(out, x), out
for n, step in ((16, 1), (8, -1)):  # a load past x's end; stores at negative offsets
    try:
        shift[(1,)](x, out, n, step, BLOCK=16 if n == 16 else 8)
    except Exception as exc:
        print(type(exc).__name__, exc)
    else:
        print("no error")
"""


def test_the_interpreter_raises_on_out_of_bounds_accesses():
    """On a CPU a stray store in Triton's interpreter writes into the process's heap (a mutant of the flash kernel
    storing at negative offsets aborted the grading subject with SIGABRT): kernelmode makes it an IndexError."""
    import torch

    if importlib.util.find_spec("triton") is None or torch.cuda.is_available():
        pytest.skip("the interpreter's bounds check applies on a CPU with the kernels extra installed")
    out = subprocess.run([sys.executable, "-c", GUARD_PROBE], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 2 and all("out-of-bounds" in line for line in lines), out.stdout
    assert "out-of-bounds load" in lines[0] and "out-of-bounds store" in lines[1], out.stdout


FP16_ACCUMULATOR = """
@triton.jit
def dot_kernel(a_ptr, c_ptr, K, BM: tl.constexpr):
    tile = tl.arange(0, BM)[:, None] * BM + tl.arange(0, BM)[None, :]
    acc = tl.zeros((BM, BM), dtype=ACC)
    for _ in range(0, K, BM):
        a = tl.load(a_ptr + tile)
        acc += tl.dot(a, a)
    tl.store(c_ptr + tile, acc)
"""


@pytest.mark.parametrize("acc,rejected", [("tl.float32", False), ("tl.float16", True)])
def test_the_lab_compiles_triton_kernels_for_a_gpu_without_one(acc, rejected):
    """Lab 11's compile check (the launch-recorder cell's ``_COMPILER``, run as its tests run it: a fresh process
    without TRITON_INTERPRET) compiles for sm_90 on this CPU, and rejects what the interpreter forgives."""
    import ast
    import os

    if importlib.util.find_spec("triton") is None:
        pytest.skip("the kernels extra is not installed here")
    cells = json.loads(SOURCE.read_text())["cells"]
    cell = next("".join(c["source"]) for c in cells if c.get("id") == "launch-recorder")
    compiler = next(node.value.value for node in ast.parse(cell).body if isinstance(node, ast.Assign)
                    and getattr(node.targets[0], "id", None) == "_COMPILER")
    job = {"source": FP16_ACCUMULATOR.replace("ACC", acc), "name": "dot_kernel", "target": ["cuda", 90, 32],
           "types": {"a_ptr": "*fp32", "c_ptr": "*fp32", "K": "i32", "BM": ["constexpr", 16]}}
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    with __import__("tempfile").TemporaryDirectory() as cache:
        out = subprocess.run([sys.executable, "-c", compiler], input=json.dumps(job), capture_output=True, text=True,
                             env=env | {"TRITON_CACHE_DIR": cache}, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    error, failed = json.loads(out.stdout.strip().splitlines()[-1])
    assert failed is None, f"Triton could not compile for sm_90 here: {failed}"
    assert (error is not None) == rejected, error
    if rejected:
        assert "Loop-carried variable acc" in error, error


# ------------------------------------------------------------------------------------------ compiled on a GPU
def _cuda_or_skip():
    import torch

    if importlib.util.find_spec("triton") is None:
        pytest.skip("the kernels extra (triton) is not installed here")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU: without one Lab 11's kernels run in the interpreters (tests/labs/test_labs.py)")


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """The solution's code as a module (Triton reads a kernel's source from its file): parameters, setup, answers
    and the course's helper cells, without demos or tests."""
    _cuda_or_skip()
    import nbformat

    from lab_utils.grading.quality.build import solution_module

    path = tmp_path_factory.mktemp("lab11") / "lab11_solution.py"
    return solution_module(nbformat.read(str(SOURCE), as_version=4), CODE_CELLS, path, "lab11_solution")


def _reference(q, k, v, causal):
    q, k, v = q.double(), k.double(), v.double()
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        n_q, n_k = s.shape[-2:]
        s = s.masked_fill(~__import__("torch").ones(n_q, n_k, dtype=bool, device=q.device).tril(), -1e6)
    return s.softmax(-1) @ v, s.logsumexp(-1)


@pytest.mark.gpu
def test_the_lab_compiles_its_kernels_on_cuda(lab):
    from lab_utils.labkit import kernelmode

    assert (lab.DEVICE, lab.KERNEL_MODE) == ("cuda", kernelmode.COMPILED), (
        f"on a CUDA machine the lab ran its kernels {lab.KERNEL_MODE} on {lab.DEVICE}")
    assert not getattr(lab.flash_fwd_kernel, "__module__", "").startswith("triton.runtime.interpreter")
    assert type(lab.flash_fwd_kernel).__name__ == "JITFunction", type(lab.flash_fwd_kernel)


@pytest.mark.gpu
def test_softmax_and_matmul_match_torch_on_cuda(lab):
    import torch

    g = torch.Generator(device="cuda").manual_seed(0)
    x = 30 * torch.randn(1000, 777, device="cuda", generator=g)
    torch.testing.assert_close(lab.softmax(x), torch.softmax(x.double(), -1).float(), atol=1e-6, rtol=1e-4)
    a, b = torch.randn(300, 250, device="cuda", generator=g), torch.randn(250, 131, device="cuda", generator=g)
    # tl.dot uses TF32 on tensor cores: about 3 decimal digits per product
    torch.testing.assert_close(lab.matmul(a, b), (a.double() @ b.double()).float(), atol=0.1, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_flash_attention_matches_the_reference_on_cuda(lab, causal):
    import torch

    g = torch.Generator(device="cuda").manual_seed(1)
    batch, n, d = 2, 1000, 64
    q, k, v, do = (torch.randn(batch, n, d, device="cuda", generator=g) for _ in range(4))
    o, lse = lab.flash_attention_forward(q, k, v, causal, q_tile=64, k_tile=64)
    o_ref, lse_ref = _reference(q, k, v, causal)
    torch.testing.assert_close(o, o_ref.float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse, lse_ref.float(), atol=2e-2, rtol=2e-2)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    lab.FlashAttention.apply(*leaves, causal).backward(do)
    refs = [t.double().requires_grad_() for t in (q, k, v)]
    _reference(*refs, causal)[0].backward(do.double())
    for got, ref in zip(leaves, refs):
        torch.testing.assert_close(got.grad, ref.grad.float(), atol=5e-2, rtol=5e-2)


@pytest.mark.gpu
def test_flash_attention_memory_is_linear_on_cuda(lab):
    """At N = 16384 the N x N scores alone are 1 GiB per batch element; the flash forward allocates O and L."""
    import torch

    n, d = 16384, 64
    q, k, v = (torch.randn(1, n, d, device="cuda") for _ in range(3))
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    lab.flash_attention_forward(q, k, v, True, q_tile=64, k_tile=64)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    assert peak < 8 * n * d * 4, f"the flash forward at N = {n} peaked at {peak / 2**20:.1f} MiB above its inputs"


@pytest.mark.gpu
def test_numba_transpose_compiles_on_cuda(lab):
    import numpy as np

    from lab_utils.labkit import kernelmode

    if kernelmode.numba_simulated_because:
        pytest.skip(kernelmode.numba_simulated_because)
    a = np.random.default_rng(0).standard_normal((1000, 333)).astype(np.float32)
    np.testing.assert_array_equal(lab.transpose(a, block=(32, 8)), a.T)


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_lab_runs_compiled_under_papermill(tmp_path):
    """The whole notebook on one GPU with bigger attention sizes: it says it compiled its kernels, and its tests pass."""
    _cuda_or_skip()
    import shutil

    import papermill

    work = tmp_path / LAB
    shutil.copytree(SOURCE.parent, work)
    out = tmp_path / "executed.ipynb"
    papermill.execute_notebook(str(work / SOURCE.name), str(out), parameters={"SEQ_LENS": [1024, 4096, 16384]},
                               cwd=str(work), progress_bar=False, log_output=False, execution_timeout=300)
    import nbformat

    text = "".join(o.get("text", "") for c in nbformat.read(str(out), as_version=4).cells for o in c.get("outputs", [])
                   if o.get("output_type") == "stream")  # nbformat joins the lines a .ipynb stores as a list
    assert "kernels run compiled on cuda" in text, text[:500]
