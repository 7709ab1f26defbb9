"""Stanford CS336 (2026) assignment 2's public FSDP tests, run against Lab 03's FSDP through tests/helpers/cs336_adapters.py.

Their tests are not vendored: point ``CS336_TESTS`` at a checkout of stanford-cs336/assignment2-systems (its
``tests/`` and ``cs336-basics/``). Their model needs einops, einx and jaxtyping: installed in this venv, or in a
folder named by ``CS336_PYTHONPATH`` (``pip install --target DIR einops einx jaxtyping``). Without either, the
tests skip and say which is missing.

    CS336_TESTS=~/assignment2-systems .venv/bin/python -m pytest tests/labs/test_cs336_fsdp.py

Their ``tests/`` is copied to a temporary folder with its ``adapters.py`` replaced by a shim that loads ours, and
run there in one pytest process (each test spawns 2 gloo ranks with ``torch.multiprocessing``).

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
the two halves' gradients.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[1] / "helpers"
CASES = ["test_fsdp_correctness[fp32]", "test_fsdp_correctness[fp16]", "test_fsdp_gradient_sync[fp32]",
         "test_fsdp_gradient_sync[fp16]"]
FP32 = "test_fsdp_correctness[fp32]"
SHIM = '''"""Written by dtlabs' tests/labs/test_cs336_fsdp.py: CS336's FSDP adapters, answered by Lab 03's FSDP."""
import importlib.util
import os

_spec = importlib.util.spec_from_file_location("dtlabs_cs336_adapters", os.environ["DTLABS_CS336_ADAPTERS"])
_adapters = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_adapters)
get_fsdp = _adapters.get_fsdp
fsdp_on_after_backward = _adapters.fsdp_on_after_backward
fsdp_gather_full_params = _adapters.fsdp_gather_full_params
'''


def _missing() -> str | None:
    root = os.environ.get("CS336_TESTS")
    if not root:
        return ("set CS336_TESTS to a checkout of stanford-cs336/assignment2-systems (their tests are not vendored "
                "here)")
    if not (Path(root) / "tests" / "test_fsdp.py").is_file() or not (Path(root) / "cs336-basics").is_dir():
        return f"CS336_TESTS={root} has no tests/test_fsdp.py or cs336-basics/"
    extra = os.environ.get("CS336_PYTHONPATH", "")
    probe = subprocess.run([sys.executable, "-c", "import einops, einx, jaxtyping"], capture_output=True,
                           env={**os.environ, "PYTHONPATH": extra})
    if probe.returncode:
        return ("cs336_basics needs einops, einx and jaxtyping: install them in this venv or in a folder named by "
                "CS336_PYTHONPATH")
    return None


def _run_theirs(work: Path, adapters: str, select: str | None = None) -> dict:
    """Their tests/test_fsdp.py (only ``select`` where given), run once with ``adapters`` behind their adapters.py:
    {test name: (outcome, message)}."""
    root = Path(os.environ["CS336_TESTS"])
    shutil.copytree(root / "tests", work / "tests")
    (work / "tests" / "adapters.py").write_text(SHIM)
    report = work / "report.xml"
    path = [str(work), str(root / "cs336-basics"), os.environ.get("CS336_PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p),
           "DTLABS_CS336_ADAPTERS": str(HERE / adapters)}
    target = str(work / "tests" / "test_fsdp.py") + (f"::{select}" if select else "")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--rootdir", str(work),
                           f"--junitxml={report}", target], cwd=work, env=env, capture_output=True, text=True,
                          timeout=900)
    if not report.exists():
        pytest.fail(f"their pytest wrote no report (exit {proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    results = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        failure = case.find("failure") if case.find("failure") is not None else case.find("error")
        results[case.get("name")] = ("failed", failure.get("message", "") + (failure.text or "")) \
            if failure is not None else ("passed", "")
    return results


@pytest.fixture(scope="module")
def cs336_run(tmp_path_factory):
    """Their tests against Lab 03's FSDP."""
    reason = _missing()
    if reason:
        pytest.skip(reason)
    return _run_theirs(tmp_path_factory.mktemp("cs336"), "cs336_adapters.py")


@pytest.fixture(scope="module")
def torch_fsdp_fp32(tmp_path_factory):
    """Their fp32 correctness test against torch's own FSDP2: (outcome, message)."""
    got = _run_theirs(tmp_path_factory.mktemp("cs336-torch"), "cs336_torch_fsdp_adapters.py", FP32)
    return got.get(FP32, ("missing", "not in their report"))


def _mismatch(message: str) -> str | None:
    """Their assertion's own words: "Step N: Parameter P mismatch. Max diff: D"."""
    found = re.search(r"Step \d+: Parameter \S+ mismatch\. Max diff: [0-9.eE+-]+", message)
    return found.group(0) if found else None


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("case", CASES)
def test_cs336_fsdp(case, cs336_run, request):
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


def test_adapter_finds_lab03_fsdp():
    """Without their tests: the adapter still finds the cells it runs (a renamed grade_id would break it silently)."""
    sys.path.insert(0, str(HERE))
    try:
        import cs336_adapters
    finally:
        sys.path.remove(str(HERE))
    for name in ("forward", "finish_gradient_synchronization", "gather_full_params"):
        assert callable(getattr(cs336_adapters.FSDP, name, None)), f"Lab 03's FSDP has no {name}"
