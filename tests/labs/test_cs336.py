"""Stanford CS336 (2026) assignment 2's public attention and FSDP tests, run by grader/cs336/run.sh against the
course's solutions: FlashAttention-2 from Lab 11 (on a CPU under Triton's interpreter), FSDP from Lab 03 (2 gloo ranks).

Their tests are not vendored: point ``CS336_TESTS`` at a checkout of stanford-cs336/assignment2-systems (its
``tests/`` and ``cs336-basics/``). Their FSDP model needs einops, einx and jaxtyping: installed in this venv, or in
a folder named by ``CS336_PYTHONPATH`` (``pip install --target DIR einops einx jaxtyping``). Without either, the
tests skip and say which is missing.

    CS336_TESTS=~/assignment2-systems .venv/bin/python -m pytest tests/labs/test_cs336.py

``test_fsdp_correctness[fp32]`` compares with ``torch.equal`` against one process that runs one backward on the
union of the two ranks' batches. Any correct FSDP on 2 ranks computes the mean gradient as (g0 + g1) / 2, with g0
and g1 the gradients of each rank's half; one backward on the whole batch sums the same 20 rows inside a matrix
multiply in another order, so the two differ in the last bits (measured on torch 2.13's CPU build: in 3,876 to
4,283 of the 6,400-8,192 elements of each linear layer's gradient and half of the norms', none of the embedding's,
by at most 4.5e-8). Whether that survives the SGD update depends on the numbers: here one weight of ``linear1``
moves one ulp apart (1.49e-8) at the first step. So that case is judged against an independent reference, torch's
own FSDP2 (``fully_shard``, tests/helpers/cs336_torch_fsdp_adapters.py) run through the same test: where it fails
with the very same message (step, parameter, difference), Lab 03's failure is reported as an expected failure that
names both; any other failure fails. Lab 03's own test checks the bit-exact claim against a reference that sums
the two halves' gradients. On a GPU their test puts the models on CUDA (two ranks on one GPU over gloo): measured on
an H200, Lab 03's FSDP passes three cases and misses fp32 by 3.7e-9 (``embedding.weight``, step 0), while FSDP2 fails
both correctness cases there (gloo with CUDA tensors), so the fp32 case fails on a GPU machine with both messages.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RUN = REPO / "grader" / "cs336" / "run.sh"
REFERENCE = Path(__file__).resolve().parents[1] / "helpers" / "cs336_torch_fsdp_adapters.py"
FP32 = "test_fsdp_correctness[fp32]"
CASES = ["test_flash_forward_pass_pytorch", "test_flash_forward_pass_triton[False]",
         "test_flash_forward_pass_triton[True]", "test_flash_backward_pytorch", "test_flash_backward_triton[False]",
         "test_flash_backward_triton[True]", FP32, "test_fsdp_correctness[fp16]", "test_fsdp_gradient_sync[fp32]",
         "test_fsdp_gradient_sync[fp16]"]


def _missing() -> str | None:
    root = os.environ.get("CS336_TESTS")
    if not root:
        return ("set CS336_TESTS to a checkout of stanford-cs336/assignment2-systems (their tests are not vendored "
                "here)")
    probe = subprocess.run([sys.executable, "-c", "import einops, einx, jaxtyping"], capture_output=True,
                           env={**os.environ, "PYTHONPATH": os.environ.get("CS336_PYTHONPATH", "")})
    if probe.returncode:
        return ("cs336_basics needs einops, einx and jaxtyping: install them in this venv or in a folder named by "
                "CS336_PYTHONPATH")
    return None


def _run(tmp: Path, **env) -> dict:
    """grader/cs336/run.sh, once: {test name: (outcome, message)}."""
    report = tmp / "report.xml"
    proc = subprocess.run(["bash", str(RUN), os.environ["CS336_TESTS"], f"--junitxml={report}"],
                          env={**os.environ, "PYTHON": sys.executable, **env}, capture_output=True, text=True,
                          timeout=900)
    if not report.exists():
        pytest.fail(f"run.sh wrote no report (exit {proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    results = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        failure = case.find("failure") if case.find("failure") is not None else case.find("error")
        results[case.get("name")] = ("failed", failure.get("message", "") + (failure.text or "")) \
            if failure is not None else ("skipped", "") if case.find("skipped") is not None else ("passed", "")
    return results


@pytest.fixture(scope="module")
def cs336_run(tmp_path_factory):
    """Their tests against the course's solutions."""
    reason = _missing()
    if reason:
        pytest.skip(reason)
    return _run(tmp_path_factory.mktemp("cs336"))


@pytest.fixture(scope="module")
def torch_fsdp_fp32(tmp_path_factory):
    """Their fp32 correctness test against torch's own FSDP2: (outcome, message)."""
    got = _run(tmp_path_factory.mktemp("cs336-torch"), CS336_ADAPTERS=str(REFERENCE),
               CS336_SELECT=f"tests/test_fsdp.py::{FP32}")
    return got.get(FP32, ("missing", "not in their report"))


def _mismatch(message: str) -> str | None:
    """Their assertion's own words: "Step N: Parameter P mismatch. Max diff: D"."""
    found = re.search(r"Step \d+: Parameter \S+ mismatch\. Max diff: [0-9.eE+-]+", message)
    return found.group(0) if found else None


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("case", CASES)
def test_cs336(case, cs336_run, request):
    outcome, message = cs336_run.get(case, ("missing", "not in their report"))
    if outcome == "passed":
        return
    ours = _mismatch(message)
    if case == FP32 and ours:
        theirs_outcome, theirs_message = request.getfixturevalue("torch_fsdp_fp32")
        if theirs_outcome == "failed" and _mismatch(theirs_message) == ours:
            pytest.xfail(f"torch.equal against one backward on the union batch: {ours}; torch's own FSDP2 "
                         "(fully_shard) fails their test with the very same words (module docstring)")
        pytest.fail(f"CS336's {case}: {ours}, and torch's FSDP2 does not fail so ({theirs_outcome}: "
                    f"{_mismatch(theirs_message) or theirs_message[-2000:]})")
    pytest.fail(f"CS336's {case} {outcome}:\n{message[-4000:]}")


def test_the_adapter_finds_the_cells_it_runs():
    """Without their tests: every cell the adapter reads is in its lab (a renamed grade_id would break it silently)."""
    import importlib.util

    import nbformat

    spec = importlib.util.spec_from_file_location("dtlabs_cs336_adapters", RUN.parent / "adapters.py")
    adapters = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(adapters)
    for lab, cells in (("11_gpu_kernels", adapters.ATTENTION_CELLS), ("03_fsdp_zero", adapters.FSDP_CELLS)):
        nb = nbformat.read(str(REPO / "solutions" / lab / f"{lab}.ipynb"), as_version=4)
        ids = {c.get("metadata", {}).get("nbgrader", {}).get("grade_id") for c in nb.cells}
        assert not set(cells) - ids, f"{lab} has no cells {sorted(set(cells) - ids)}"
