"""The cheat corpus (grader/cheats/, see its README) graded the way an instructor grades: no cheat gains anything,
nothing of the course changes, a victim graded after every attacker keeps full marks, nothing survives.

Graded with bubblewrap where it works, else in the fallback (DTLABS_SANDBOX=off); DTLABS_FULL=1 (the nightly job)
grades both, the fallback only the attacks whose defence depends on the sandbox mode (grader/cheats/README.md).
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import uuid
from pathlib import Path

import nbformat
import pytest
from conftest import TEST_TOKEN_VAR, assert_no_leftovers
from known_wrong import read_known_wrong

from lab_utils import grading, sandbox

REPO = grading.REPO_ROOT
LAB = "01_ddp_setup"
TARGET = "test_ring_all_reduce"
CHEATS = sorted((REPO / "grader" / "cheats").glob("*.py"))
HONEST = read_known_wrong(REPO / "grader" / "known_wrong" / LAB / "ring_assumes_divisible.py")
PWNED = Path("/tmp/dtlabs-pwned")


def _header(path: Path) -> dict:
    head = {}
    for line in path.read_text().splitlines():
        m = re.match(r"^#\s*(attack|defended-by|tamper|sandbox-only)\s*:\s*(.*)$", line)
        if m:
            head[m.group(1)] = m.group(2).strip()
        elif not line.startswith("#"):
            break
    return head


def _corpus(mode: str) -> list[Path]:
    """Every cheat with the sandbox. In the fallback, those whose defence depends on the sandbox mode (not `split`
    alone: that is the same code in both) and that the fallback can stop (the others say why in `sandbox-only`)."""
    def in_fallback(head):
        return head.get("defended-by", "").replace(" ", "") != "split" and "sandbox-only" not in head

    return [p for p in CHEATS if mode == "bwrap" or in_fallback(_header(p))]


def _tree_digest(root: Path) -> dict:
    """path -> sha256 of every file of the course but its grading work folder."""
    out = {}
    for sub in ("lab_utils", "solutions", "labs", "grader"):
        for p in sorted((root / sub).rglob("*")):
            if p.is_file() and "work" not in p.relative_to(root).parts and "__pycache__" not in p.parts:
                out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _cut(nb, grade_id):
    """Up to the cell the attacks aim at, without the demo cells (which no test depends on, tests/test_labs.py)."""
    nb = grading.without_demos(nb)
    idx = max(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)
    nb.cells = nb.cells[: idx + 1]
    return nb


def _course(root: Path) -> tuple:
    shutil.copytree(REPO / "solutions" / LAB, root / "solutions" / LAB)
    grading.release([LAB], root=root)
    rel = nbformat.read(str(root / "labs" / LAB / f"{LAB}.ipynb"), as_version=4)
    src = nbformat.read(str(REPO / "solutions" / LAB / f"{LAB}.ipynb"), as_version=4)
    return rel, src


def _grade_corpus(root: Path, mode: str, monkeypatch) -> dict:
    rel, src = _course(root)
    grading.submit(root, "honest", LAB, _cut(grading.fill_solutions(rel, src, {"ring_all_reduce": HONEST.source}), TARGET))
    for path in _corpus(mode):
        head = _header(path)
        nb = grading.fill_solutions(rel, src, {"ring_all_reduce": HONEST.source + "\n\n\n" + path.read_text()})
        if head.get("tamper"):
            for cell in nb.cells:
                meta = cell.metadata.get("nbgrader", {})
                if meta.get("grade_id") == head["tamper"]:
                    cell.source = "pass"
                    meta.update(solution=True, locked=False)
        grading.submit(root, f"cheat_{path.stem}", LAB, _cut(nb, TARGET))
    grading.submit(root, "zz_victim", LAB, _cut(grading.fill_solutions(rel, src), TARGET))  # graded last
    before = _tree_digest(root)
    repo_before = _tree_digest(REPO)
    PWNED.unlink(missing_ok=True)
    token = uuid.uuid4().hex
    monkeypatch.setenv(TEST_TOKEN_VAR, token)
    monkeypatch.setenv("DTLABS_MEMORY_MB", "4096")
    monkeypatch.setenv("DTLABS_MAX_PROCS", "64")
    if mode == "fallback":
        monkeypatch.setenv("DTLABS_SANDBOX", "off")
    sandbox.bwrap_path.cache_clear()
    lines = []
    try:
        code = grading.grade([LAB], course_root=root, jobs=2, feedback=False, out=lines.append, progress=False)
    finally:
        sandbox.bwrap_path.cache_clear()
    repo_after = _tree_digest(REPO)
    assert_no_leftovers(token)
    return {"code": code, "lines": lines, "before": before, "after": _tree_digest(root), "repo_before": repo_before,
            "repo_after": repo_after}


# make test grades the corpus in the mode grading uses here (bubblewrap where it works, else the fallback); the
# nightly job (DTLABS_FULL=1) grades it in both. Under pytest-xdist one worker grades a corpus and runs its tests.
FULL = os.environ.get("DTLABS_FULL", "") not in ("", "0")
MODES = ["bwrap", "fallback"] if FULL else ["bwrap" if sandbox.bwrap_path() else "fallback"]


@pytest.fixture(scope="module", params=[pytest.param(m, marks=pytest.mark.xdist_group(f"cheats-{m}")) for m in MODES])
def corpus(request, tmp_path_factory):
    if request.param == "bwrap":
        if not sandbox.bwrap_path():
            pytest.skip("bubblewrap is not usable here (apt-get install bubblewrap); the fallback run still checks")
    mp = pytest.MonkeyPatch()
    root = tmp_path_factory.mktemp(f"cheats-{request.param}")
    try:
        result = _grade_corpus(root, request.param, mp)
    finally:
        mp.undo()
    result["root"] = root
    result["mode"] = request.param
    return result


def _scores(corpus, student):
    return grading.cell_scores(corpus["root"], LAB, student)


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_the_honest_answer_underneath_scores_zero_and_the_victim_full_marks(corpus):
    honest, victim = _scores(corpus, "honest"), _scores(corpus, "zz_victim")
    assert honest.get(TARGET) == (0.0, 3.0), f"the honest wrong ring should score 0/3: {honest}\n" + "\n".join(corpus["lines"])
    assert victim.get(TARGET) == (3.0, 3.0), (
        f"the victim graded after every attacker lost points: {victim}\n" + "\n".join(corpus["lines"]))


@pytest.mark.slow
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("cheat", [p.stem for p in CHEATS])
def test_cheat_gains_nothing(corpus, cheat):
    if cheat not in {p.stem for p in _corpus(corpus["mode"])}:
        head = _header(REPO / "grader" / "cheats" / (cheat + ".py"))
        pytest.skip(f"{cheat} is stopped only by the sandbox: {head['sandbox-only']}" if "sandbox-only" in head else
                    f"{cheat} is defended by split execution alone, the same code in both modes: graded with bwrap")
    honest = _scores(corpus, "honest")
    got = _scores(corpus, f"cheat_{cheat}")
    line = next((x for x in corpus["lines"] if f"cheat_{cheat}/" in x), "(no line)")
    gained = {gid: s for gid, s in got.items() if s[0] > honest.get(gid, (0, 0))[0]}
    assert not gained, f"[{corpus['mode']}] {cheat} gained points over the honest answer: {gained}\n{line}"


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_course_and_gradebook_are_unchanged(corpus):
    assert corpus["after"] == corpus["before"], "grading changed the course's files: " + ", ".join(
        k for k in corpus["after"] if corpus["before"].get(k) != corpus["after"].get(k))
    assert corpus["repo_after"] == corpus["repo_before"], "grading changed the repository's own files: " + ", ".join(
        k for k in corpus["repo_after"] if corpus["repo_before"].get(k) != corpus["repo_after"].get(k))
    assert not PWNED.exists(), "a hostile return value ran code in the grader"
    from nbgrader.api import Gradebook

    with Gradebook(grading.gradebook.db_url(corpus["root"])) as gb:
        for sub in gb.assignment_submissions(LAB):
            for nb in sub.notebooks:
                manual = [g.name for g in nb.grades if g.manual_score is not None]
                assert not manual, f"{sub.student.id} has manual scores nobody gave: {manual}"


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_no_hidden_test_reaches_a_cheats_output(corpus):
    src = nbformat.read(str(REPO / "solutions" / LAB / f"{LAB}.ipynb"), as_version=4)
    hidden = [line.strip() for c in src.cells for line in c.source.split("### BEGIN HIDDEN TESTS")[1:]
              for line in line.split("### END HIDDEN TESTS")[0].splitlines() if len(line.strip()) > 20]
    assert hidden
    for path in _corpus(corpus["mode"]):
        nb_path = corpus["root"] / "grader" / "work" / "autograded" / f"cheat_{path.stem}" / LAB / f"{LAB}.ipynb"
        if not nb_path.is_file():
            continue
        nb = nbformat.read(str(nb_path), as_version=4)
        answers = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "ring_all_reduce"]
        text = "".join(str(o) for c in answers for o in c.get("outputs", []))
        leaked = [h for h in hidden if h in text]
        assert not leaked, f"[{corpus['mode']}] {path.stem} printed a hidden test line: {leaked[0]}"


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_limits_and_reasons_are_reported(corpus):
    lines = "\n".join(corpus["lines"])
    assert re.search(r"cheat_memory_hog/.*memory limit", lines), lines
    assert re.search(r"cheat_fork_flood/.*process limit", lines), lines
    assert re.search(r"cheat_tamper_test_cell/.*tampered test cell test_ring_all_reduce", lines), lines
