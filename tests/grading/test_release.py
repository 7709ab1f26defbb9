"""labs/ is exactly what `make release` makes from solutions/, and committed notebooks are reproducible.

The release is nbgrader's ``generate_assignment`` (``lab_utils.grading.release``); these tests regenerate it
into a temporary folder and compare bytes with the committed labs/, so a hand edit of labs/ or a solution
changed without `make release` fails CI with the fix in the message.
"""
from __future__ import annotations

import filecmp
import json
from pathlib import Path

import pytest

from helpers.synthetic import SYNTHETIC_LAB, make_synthetic_course

from lab_utils import grading

pytestmark = pytest.mark.xdist_group("release")  # one worker makes the module's fresh release

REPO = grading.REPO_ROOT
LABS = grading.discover_labs(REPO)
COMMITTED = sorted(
    [p for p in (REPO / "solutions").glob("*/*.ipynb") if ".ipynb_checkpoints" not in p.parts]
    + [p for p in (REPO / "labs").glob("*/*.ipynb") if ".ipynb_checkpoints" not in p.parts]
)
FIX = "run `make release` (or `dtlabs release`) and commit labs/"


def _files(folder: Path) -> list[str]:
    ignore = {".ipynb_checkpoints", "__pycache__"}
    return sorted(
        str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and not ignore & set(p.parts)
    )


@pytest.fixture(scope="module")
def fresh_release(tmp_path_factory):
    dest = tmp_path_factory.mktemp("release")
    if LABS:
        grading.release(LABS, dest=dest)
    return dest


@pytest.mark.timeout(900)
@pytest.mark.parametrize("lab", LABS)
def test_committed_release_equals_a_fresh_release_byte_for_byte(lab, fresh_release):
    committed, fresh = REPO / "labs" / lab, fresh_release / lab
    assert committed.is_dir(), f"labs/{lab}/ is missing: {FIX}"
    assert _files(committed) == _files(fresh), f"labs/{lab}/ has other files than a fresh release: {FIX}"
    for rel in _files(fresh):
        same = filecmp.cmp(committed / rel, fresh / rel, shallow=False)
        assert same, f"labs/{lab}/{rel} differs from a fresh release of solutions/{lab}/: {FIX}"


def test_every_released_lab_has_a_source():
    released = sorted(p.name for p in (REPO / "labs").iterdir() if p.is_dir()) if (REPO / "labs").is_dir() else []
    orphans = [lab for lab in released if lab not in LABS]
    assert not orphans, f"labs/{orphans} have no solutions/ source: delete them or restore the source"


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: str(p.relative_to(REPO)))
def test_committed_notebook_has_no_outputs_or_execution_metadata(path):
    problems = grading.notebook_problems(path)
    assert not problems, (
        f"{path.relative_to(REPO)} must be committed clean (AUTHORING.md): " + "; ".join(problems[:10])
        + ". Clear all outputs (Edit > Clear Outputs of All Cells) and save; for labs/: " + FIX
    )


@pytest.mark.parametrize("lab", LABS)
def test_release_hides_solutions_and_hidden_tests(lab):
    path = REPO / "labs" / lab / f"{lab}.ipynb"
    if not path.is_file():
        pytest.fail(f"labs/{lab}/{lab}.ipynb is missing: {FIX}")
    nb = json.loads(path.read_text())
    text = json.dumps(nb)
    for marker in grading.SOLUTION_MARKERS + grading.HIDDEN_MARKERS:
        assert marker not in text, f"labs/{lab}: '{marker}' leaked into the release: {FIX}"
    stubs = [c for c in nb["cells"] if c.get("metadata", {}).get("nbgrader", {}).get("solution")
             and c["cell_type"] == "code"]
    assert stubs, f"labs/{lab} has no solution cells"
    for cell in stubs:
        assert "NotImplementedError" in "".join(cell["source"]), f"labs/{lab}: cell {cell['id']} is not a stub"


@pytest.mark.timeout(600)
def test_release_is_deterministic(tmp_path):
    """nbgrader writes no timestamps: two releases of the same source are identical, byte for byte."""
    root = make_synthetic_course(tmp_path / "course")
    a, b = tmp_path / "a", tmp_path / "b"
    grading.release([SYNTHETIC_LAB], root=root, dest=a)
    grading.release([SYNTHETIC_LAB], root=root, dest=b)
    nb = a / SYNTHETIC_LAB / f"{SYNTHETIC_LAB}.ipynb"
    assert nb.read_bytes() == (b / SYNTHETIC_LAB / f"{SYNTHETIC_LAB}.ipynb").read_bytes()
    assert grading.notebook_problems(nb) == []
    assert not (root / "grader" / "work" / "gradebook.db").exists(), "a trial release must not touch the gradebook"
    assert not (root / "labs").exists(), "a trial release must not write labs/"


def test_release_of_an_unknown_lab_is_a_clear_error(tmp_path):
    with pytest.raises(grading.GradingError, match="no solutions"):
        grading.release(["99_nope"], root=tmp_path)
