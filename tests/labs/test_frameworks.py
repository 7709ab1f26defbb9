"""Lab 10's optional frameworks extra (``pip install .[frameworks]``): where it is installed, what it must not touch,
and the framework that cannot be installed beside the course's torch (Horovod): skipped there with the reason measured
on this course's machine, and run for real in its own environment where ``make horovod`` built it.

The framework runs themselves are Lab 10's graded cells (DeepSpeed ZeRO 1-3, Ray Train, TensorFlow, and Accelerate
as a demo), proved by tests/labs/test_labs.py like every lab's: under papermill and in the sandboxed swap session. The
papermill runs start their kernel from this venv reached through a folder named "My Courses": without the lab's
ray_instance() workaround, Ray Train's fit hangs there (Ray starts its workers through `bash -c` with their paths
unquoted).
"""
from __future__ import annotations

import importlib.util
import platform
import subprocess
import sys

import pytest

FRAMEWORKS = ("deepspeed", "ray", "tensorflow", "accelerate")
# The Makefile installs the extra where the frameworks have wheels (and FRAMEWORKS=0 was not asked for).
PLATFORM_ALLOWS = platform.system() == "Linux" and platform.machine() == "x86_64" and sys.version_info < (3, 14)

# With Python 3.11, torch 2.13.0+cpu, gcc 12.2 and cmake 3.25,
#   HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_TENSORFLOW=1 \
#   HOROVOD_WITHOUT_MXNET=1 pip install --no-build-isolation horovod==0.28.1
# builds its bundled gloo for minutes and fails on the torch extension (exit 1).
HOROVOD_REASON = (
    "horovod 0.28.1 (its last release, June 2023) does not build against torch 2.13: its CMake build compiles the "
    "torch extension with -std=c++14 and torch's headers stop it ('#error C++17 or later compatible compiler is "
    "required to use PyTorch.', then \"'is_enum_v' is not a member of 'std'\"); measured: pip install "
    "--no-build-isolation horovod==0.28.1 failed after 8 min 48 s of compiling. `make horovod` builds it in an "
    "environment of its own against torch 2.0.1 (.venv-horovod), where Lab 10 runs it"
)


def test_lab_utils_imports_no_framework():
    """The frameworks are Lab 10's alone: importing the course package (and what every lab imports) loads none."""
    code = ("import sys, lab_utils, lab_utils.launcher.launch, lab_utils.labkit.checks, lab_utils.labkit.data, "
            "lab_utils.labkit.models, lab_utils.grading.split.proxy;"
            f"print([m for m in {FRAMEWORKS + ('horovod',)!r} if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]", f"importing lab_utils loaded {out}: keep framework imports inside Lab 10's cells"


@pytest.mark.parametrize("module", FRAMEWORKS)
def test_frameworks_extra_is_installed_where_the_platform_allows(module):
    if not PLATFORM_ALLOWS:
        pytest.skip(f"no wheels of Lab 10's frameworks for {platform.system()} {platform.machine()} "
                    f"Python {sys.version_info.major}.{sys.version_info.minor}: the Makefile leaves the extra out")
    assert importlib.util.find_spec(module) is not None, (
        f"{module} is missing: `make install` installs `.[frameworks]` on this platform (FRAMEWORKS=0 leaves it out, "
        "and Lab 10's framework tests then fail with that message)")


def test_frameworks_extra_kept_the_cpu_torch():
    """Installing the extra must not have replaced the torch wheel (a framework pulling a CUDA build)."""
    import torch

    if not PLATFORM_ALLOWS or importlib.util.find_spec("deepspeed") is None:
        pytest.skip("the frameworks extra is not installed here")
    spec = __import__("os").environ.get("TORCH_SPEC", "")
    if "==" in spec:
        assert torch.__version__.split("+")[0] == spec.split("==")[1].strip(), (
            f"torch is {torch.__version__}, TORCH_SPEC asked for {spec}: installing the extra replaced torch")


def test_horovod_builds_against_the_installed_torch():
    try:
        import horovod.torch  # noqa: F401
    except ImportError:
        pytest.skip(HOROVOD_REASON)
    pytest.fail("horovod imports here now: add it to Lab 10 (and to the frameworks extra) instead of this skip")


HOROVOD_RUN = '''
import json, math, os, sys, time
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler
from lab_utils.labkit.data import dataset, regression
from lab_utils.labkit.models import mlp
{helpers}

run = train_horovod(5, 4, 0.05, 3, 32, world_size=2)
state, _ = train_reference(mlp(seed=3), dataset(*regression(n=32, seed=3)), 5, 4, 0.05, 3, 2)
gap = max((run["state"][k] - v).abs().max().item() for k, v in state.items())
print("HOROVOD", run["size"], run["torch"], gap, flush=True)
'''


@pytest.mark.slow  # horovodrun starts two processes that import torch 2.0.1: about 15 s
def test_horovod_in_its_own_environment_lands_where_one_process_lands(tmp_path):
    """Lab 10's train_horovod: hvd.DistributedOptimizer under `horovodrun --gloo`, in the environment `make horovod`
    builds, on the batches and starting weights Lab 10 makes with the course's torch: the weights of one process on
    the union of the batches (Lab 01's train_reference)."""
    import os
    from pathlib import Path

    from lab_utils import processes

    hvd_python = os.environ.get("DTLABS_HOROVOD_PYTHON") or str(Path(__file__).resolve().parents[2] / ".venv-horovod" / "bin" / "python")
    built = os.path.exists(hvd_python) and subprocess.run([hvd_python, "-c", "import horovod.torch"],
                                                          capture_output=True).returncode == 0
    if not built:
        pytest.skip(f"Horovod's environment is not built ({hvd_python}): `make horovod` builds it (.ci/build-horovod)")
    (tmp_path / "run.py").write_text(HOROVOD_RUN.format(helpers=_lab10_helpers()))
    proc = subprocess.run([sys.executable, str(tmp_path / "run.py")], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": processes.python_path()}, timeout=300)
    out = proc.stdout + proc.stderr
    line = next((l for l in proc.stdout.splitlines() if l.startswith("HOROVOD ")), None)
    assert proc.returncode == 0 and line, out[-3000:]
    _, size, torch_version, gap = line.split()
    assert int(size) == 2 and torch_version.startswith("2.0."), line
    assert float(gap) < 1e-5, f"Horovod's weights differ from one process's by {gap}"


def _lab10_helpers() -> str:
    """The source of Lab 10's helper cell (ray_instance, deepspeed_on_cpu, quiet_stderr, ...), to run in a script."""
    import json
    from pathlib import Path

    cells = json.loads((Path(__file__).resolve().parents[2] / "solutions" / "10_3d_frameworks" /
                        "10_3d_frameworks.ipynb").read_text())["cells"]
    return next("".join(c["source"]) for c in cells
                if c["metadata"].get("nbgrader", {}).get("grade_id") == "frameworks_helpers")


DEEPSPEED_STEP = '''
import os, sys
import torch
import torch.distributed as dist
{helpers}

os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1")  # as the course's launcher sets
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
deepspeed = deepspeed_on_cpu()
model = torch.nn.Linear(4, 2)
config = {{"train_micro_batch_size_per_gpu": 2, "optimizer": {{"type": "Adam", "params": {{"lr": 0.1, "torch_adam": True}}}},
          "zero_optimization": {{"stage": 3}}, "steps_per_print": 10**9}}
with quiet_stderr():
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    loss = engine(torch.ones(2, 4)).square().mean()
    engine.backward(loss)
    engine.step()
print("STEPPED", flush=True)
dist.destroy_process_group()
'''


@pytest.mark.slow  # imports DeepSpeed: about 10 s
def test_a_deepspeed_step_does_not_depend_on_numactl(tmp_path):
    """Lab 10's deepspeed_on_cpu() where `numactl` cannot be run (a folder on PATH that cannot be searched gives
    PermissionError, which DeepSpeed's CPU device count does not catch): a ZeRO-3 step still completes. A `numactl`
    without execute permission first on PATH stands for it, for root too."""
    import os

    from lab_utils import processes

    if importlib.util.find_spec("deepspeed") is None:
        pytest.skip("deepspeed is not installed here (the frameworks extra)")
    helpers = _lab10_helpers()
    trap = tmp_path / "bin"
    trap.mkdir()
    (trap / "numactl").write_text("#!/bin/sh\nexit 0\n")
    (trap / "numactl").chmod(0o644)
    (tmp_path / "step.py").write_text(DEEPSPEED_STEP.format(helpers=helpers))
    env = {**os.environ, "PATH": f"{trap}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": processes.python_path()}
    for name in ("LOCAL_SIZE", "LOCAL_WORLD_SIZE", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    proc = subprocess.run([sys.executable, str(tmp_path / "step.py"), str(tmp_path / "store")], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=240)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "STEPPED" in out, out[-3000:]
