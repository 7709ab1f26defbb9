"""The two ways to install (pip via the Makefile, conda via environment.yml) name the same dependencies."""
from __future__ import annotations

import re
import subprocess
import sys
try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
CONDA_NAMES = {"torch": "pytorch"}  # PyPI name -> conda-forge name where they differ


def _split(spec):
    m = re.match(r"^\s*([A-Za-z0-9_.\-]+)\s*(.*)$", spec)
    return m.group(1).lower(), m.group(2).replace(" ", "")


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    want = {CONDA_NAMES.get(n, n): v for n, v in map(_split, project["dependencies"])}
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    specs = [d for d in env["dependencies"] if isinstance(d, str) and _split(d)[0] not in ("pip", "python")]
    conda = dict(map(_split, specs))
    assert conda == want, f"environment.yml and pyproject.toml disagree: {set(conda.items()) ^ set(want.items())}"
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert "-e .[test]" in pip, "environment.yml must install the course package itself"


def test_nbformat_does_not_compile_iri_grammars_on_import():
    """Every nbgrader, papermill and Jupyter process imports nbformat; jsonschema 4.24+ makes that import compile
    rfc3987-syntax's Lark grammars (2.7 s of CPU each time). pyproject.toml pins jsonschema below that."""
    code = "import sys, nbformat; print('rfc3987_syntax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False", ("importing nbformat loaded rfc3987_syntax: reinstall with `make install` "
                            "(pyproject.toml keeps jsonschema<4.24 for this)")


def test_torch_is_a_range_and_the_makefile_takes_its_spec_from_a_variable():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    torch = [d for d in deps if _split(d)[0] == "torch"]
    assert torch and ">=" in torch[0] and "==" not in torch[0]
    makefile = (ROOT / "Makefile").read_text()
    assert "TORCH_SPEC ?=" in makefile and '"$(TORCH_SPEC)"' in makefile
    assert "TORCH_SPEC" in (ROOT / ".ci" / "run").read_text()


def test_dtlabs_console_script_is_installed():
    exe = Path(sys.executable).with_name("dtlabs")
    assert exe.exists(), "dtlabs is declared in [project.scripts]; `make install` puts it next to python"
    out = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "doctor" in out.stdout


def test_ci_runs_the_readme_test_command():
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    assert "make test" in (ROOT / "README.md").read_text()


def test_the_wheel_holds_every_module_and_the_default_nbgrader_config(tmp_path):
    """`pip install .` must be able to grade: every subpackage of lab_utils and its package data are in the wheel, and
    the server config that keeps JupyterLab's kernels private."""
    import shutil
    import zipfile

    src = tmp_path / "src"  # a copy, so the build leaves nothing in the checkout
    shutil.copytree(ROOT / "lab_utils", src / "lab_utils", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(ROOT / "jupyter-config", src / "jupyter-config")  # data files: the server config, see below
    run = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                          str(tmp_path / "dist"), str(src)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    wheel = next((tmp_path / "dist").glob("*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    wanted = {str(p.relative_to(ROOT)) for p in (ROOT / "lab_utils").rglob("*.py") if "__pycache__" not in p.parts}
    missing = sorted(wanted - names)
    assert not missing, f"the wheel lacks {missing}"
    assert "lab_utils/grading/default_config/nbgrader_config.py" in names
    # what enables private student kernels (lab_utils/launcher/kernel_channels.py) in <prefix>/etc/jupyter
    assert "distributed_training_labs-0.1.0.data/data/etc/jupyter/jupyter_server_config.d/dtlabs-kernels.json" in names
