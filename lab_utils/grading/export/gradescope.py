"""``dtlabs export gradescope LAB --out DIR``: a Gradescope autograder bundle, ``DIR/<LAB>-autograder.zip``.

Gradescope's autograder specification asks for a zip with ``setup.sh`` (run once, as the image is built) and
``run_autograder`` (run per submission) at its root; it unpacks the zip into ``/autograder/source``. Ours holds
what grading needs and nothing is fetched at grading time:

    setup.sh, run_autograder, run_dtlabs.py    the scripts (``bundle/``; ``autograder.py`` does the grading)
    dtlabs-autograder.json                     the lab, its test cells (names, points, visibility), what built it
    constraints.txt                            the versions this machine grades with (torch, nbgrader, ...)
    dist/<wheel>                               this package, built now from its source (or ``--wheel``)
    course/solutions/<LAB>/                    the lab's source: solutions and hidden tests, and its files
    course/grader/*.py                         the course config (c.DTLabs limits, late policy, visibility)

The bundle carries the hidden tests, as any autograder must: give it only to Gradescope.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from importlib import metadata
from pathlib import Path

from lab_utils import processes
from lab_utils.grading.course import GradingError, discover_labs, find_course_root
from lab_utils.grading.export import cells
from lab_utils.grading.export.autograder import DEFAULT_VISIBILITY, MANIFEST

BUNDLE = Path(__file__).resolve().parent / "bundle"
DIST_NAME = "distributed-training-labs"
EXECUTABLE = {"setup.sh", "run_autograder"}
ZIP_TIME = (2020, 1, 1, 0, 0, 0)  # fixed, so the same inputs give the same zip


def build_wheel(dest: Path) -> Path:
    """This package as a wheel, built from its source checkout with pip (a copy, so the checkout gets no build
    folders). ``GradingError`` if the package was installed without its source."""
    src = processes.PACKAGE_DIR.parent
    if not (src / "pyproject.toml").is_file():
        raise GradingError(f"cannot build the course package's wheel: no pyproject.toml beside {processes.PACKAGE_DIR} "
                           "(an install without its source); pass --wheel PATH to a wheel of it")
    with tempfile.TemporaryDirectory(prefix="dtlabs-wheel-") as tmp:
        copy = Path(tmp) / "src"
        shutil.copytree(processes.PACKAGE_DIR, copy / "lab_utils", ignore=shutil.ignore_patterns("__pycache__"))
        for name in ("pyproject.toml", "README.md", "LICENSE"):
            if (src / name).is_file():
                shutil.copy2(src / name, copy / name)
        if (src / "jupyter-config").is_dir():  # the data files pyproject.toml names (the server extension's switch)
            shutil.copytree(src / "jupyter-config", copy / "jupyter-config")
        run = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                              str(dest), str(copy)], capture_output=True, text=True, timeout=600)
        if run.returncode != 0:
            raise GradingError(f"building the course package's wheel failed:\n{(run.stdout + run.stderr)[-3000:]}")
    wheels = sorted(Path(dest).glob("*.whl"), key=lambda p: p.stat().st_mtime)
    if not wheels:
        raise GradingError(f"pip wheel wrote no wheel into {dest}")
    return wheels[-1]


def constraints() -> str:
    """``name==version`` of every distribution installed here but this package (local labels such as ``+cpu``
    dropped, so PyPI and PyTorch's CPU index can match them)."""
    pins = {}
    for dist in metadata.distributions():
        name = (dist.metadata.get("Name") or "").strip()
        if name and name.lower().replace("_", "-") != DIST_NAME:
            pins[name.lower()] = f"{name}=={dist.version.split('+')[0]}"
    return "".join(f"{pins[k]}\n" for k in sorted(pins))


def manifest(course_root: Path, lab: str, settings) -> dict:
    """What the bundle's runner needs before anything is imported: the lab and its test cells as results name them
    (``settings``: the command's, for ``c.DTLabs.gradescope_visibility``)."""
    from lab_utils.grading import canary

    hidden_visibility = settings.gradescope_visibility.get(lab, DEFAULT_VISIBILITY)
    tests = [{"grade_id": c.grade_id, "name": c.name, "points": c.points, "hidden": c.hidden,
              "visibility": hidden_visibility if c.hidden else "visible"}
             for c in cells.graded_cells(cells.source_notebook(course_root, lab))]
    try:
        import torch

        torch_version = torch.__version__
    except ImportError:
        torch_version = None
    return {"lab": lab, "tests": tests, "package_digest": canary._package_digest(), "torch": torch_version,
            "python": sys.version.split()[0], "exported": time.strftime("%Y-%m-%d %H:%M:%S %z")}


def _course_files(course_root: Path, lab: str):
    """(path in the bundle, file) of the lab's source folder and the course config folder's Python files."""
    lab_dir = course_root / "solutions" / lab
    for dirpath, dirnames, filenames in os.walk(lab_dir, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if d not in ("__pycache__", ".ipynb_checkpoints"))
        for name in sorted(filenames):
            path = Path(dirpath, name)
            if path.is_file() and not path.is_symlink():
                yield f"course/solutions/{lab}/{path.relative_to(lab_dir).as_posix()}", path
    for path in sorted((course_root / "grader").glob("*.py")):
        if path.is_file() and not path.is_symlink():
            yield f"course/grader/{path.name}", path


def _add(zf: zipfile.ZipFile, name: str, data: bytes) -> None:
    info = zipfile.ZipInfo(name, ZIP_TIME)
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = (0o755 if name in EXECUTABLE else 0o644) << 16
    zf.writestr(info, data)


def build(lab: str, out_dir: Path | str, *, course_root=None, settings=None, wheel: Path | str | None = None,
          out=print) -> Path:
    """Write ``out_dir/<lab>-autograder.zip`` (module docstring) under the command's ``settings`` (default: the
    course's); returns its path."""
    from lab_utils.grading.nbgrader_run import course_settings

    course_root = find_course_root(course_root)
    settings = settings if settings is not None else course_settings(course_root)
    if lab not in discover_labs(course_root):
        raise GradingError(f"no lab {lab!r} in {course_root}/solutions (labs: {discover_labs(course_root)})")
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    zip_path = out_dir / f"{lab}-autograder.zip"
    with tempfile.TemporaryDirectory(prefix="dtlabs-bundle-") as tmp:
        wheel_path = Path(wheel).resolve() if wheel else build_wheel(Path(tmp))
        if not wheel_path.is_file() or wheel_path.suffix != ".whl":
            raise GradingError(f"not a wheel: {wheel_path}")
        part = zip_path.with_name(f".{zip_path.name}.{os.getpid()}.part")
        with zipfile.ZipFile(part, "w") as zf:
            for name in ("setup.sh", "run_autograder", "run_dtlabs.py"):
                _add(zf, name, (BUNDLE / name).read_bytes())
            _add(zf, MANIFEST, json.dumps(manifest(course_root, lab, settings), indent=1).encode())
            _add(zf, "constraints.txt", constraints().encode())
            _add(zf, f"dist/{wheel_path.name}", wheel_path.read_bytes())
            for name, path in _course_files(course_root, lab):
                _add(zf, name, path.read_bytes())
        os.replace(part, zip_path)
    out(f"wrote {zip_path} ({zip_path.stat().st_size / 1e6:.2f} MB): upload it as the Gradescope assignment's "
        "autograder; it holds the hidden tests")
    return zip_path
