"""The cheat corpus (grader/cheats/, see its README) graded the way an instructor grades: no cheat gains anything,
nothing of the course changes, a victim graded after every attacker keeps full marks, nothing survives.

make test grades, with bubblewrap (where it works), the attacks that need Lab 01's own code (header ``# needs:``:
its ranks, torch, ``ring_all_reduce``) against Lab 01 and every other attack against the synthetic lab: the same
attacks on the same grading pipeline, at a few seconds per submission instead of a torch kernel, subject and rank
server each. The cheats whose defence depends on the sandbox mode are graded again in the fallback
(DTLABS_SANDBOX=off), against the synthetic lab. DTLABS_FULL=1 (the nightly job) grades the whole corpus against
Lab 01 with bubblewrap, and the fallback set against Lab 01 too. Where bubblewrap cannot run, make test grades
Lab 01 in the fallback.

In the fallback nothing stops a submission from writing what it finds, so the attacks that search the machine for
gradebooks and submissions really write them (and the course guard must put them back): there they search only
this test's folder, which holds the course and, beside it, the temp folder the grading uses, as /tmp lies beside a
course. Searching all of /tmp would damage the courses of tests running in parallel and the developer's checkout.
"""
from __future__ import annotations

import base64
import hashlib
import os
import re
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_markdown_cell
from conftest import HIDDEN_SOURCE, SYNTHETIC_LAB, TEST_TOKEN_VAR, assert_no_leftovers, make_synthetic_course
from known_wrong import read_known_wrong

from lab_utils import grading
from lab_utils.grading.boundary import sandbox

REPO = grading.REPO_ROOT
CHEATS = sorted((REPO / "grader" / "cheats").glob("*.py"))
PWNED = Path("/tmp/dtlabs-pwned")
CHEATS_LAB = "01_ddp_setup"  # the lab the cheats are written for; graded against another, they name that one


@dataclass(frozen=True)
class Target:
    """The lab a corpus is graded against: the answer cell the attacks go into, under an honest wrong answer."""

    lab: str
    answer: str  # grade_id of the answer cell
    test: str  # grade_id of the test cell the attacks aim at (the submission ends there)
    honest: str  # known-wrong file (grader/known_wrong/<lab>/) under every attack
    honest_score: tuple  # what the honest wrong answer scores on `test`
    full_score: tuple  # what the solution scores on `test`

    def course(self, root: Path) -> Path:
        if self.lab == SYNTHETIC_LAB:
            make_synthetic_course(root)
        else:
            shutil.copytree(REPO / "solutions" / self.lab, root / "solutions" / self.lab)
        grading.release([self.lab], root=root)
        return root

    def known_wrong(self, root: Path):
        folder = root if self.lab == SYNTHETIC_LAB else REPO  # the synthetic course carries its own
        return read_known_wrong(folder / "grader" / "known_wrong" / self.lab / self.honest)

    def attack(self, path: Path, search_root: Path | None = None) -> str:
        """The attack's text for this lab; ``search_root`` replaces the folders an attack searches the file system
        in (the fallback: there it would really damage other tests' courses and the developer's checkout)."""
        text = path.read_text().replace(CHEATS_LAB, self.lab)
        if search_root is not None:
            text = SEARCHED.sub(repr(str(search_root)), text)
        return text


def _beside(folder: Path, head: dict, target: Target) -> None:
    """What a cheat puts beside its notebook: the links its header names, the files it ships."""
    for spec in filter(None, (x.strip() for x in head.get("links", "").split(";"))):
        name, target_path = (x.strip() for x in spec.split("->"))
        (folder / name).symlink_to(target_path.replace(CHEATS_LAB, target.lab))
    if head.get("ships"):
        shutil.copytree(REPO / "grader" / "cheats" / head["ships"], folder, dirs_exist_ok=True)


SVG = base64.b64encode(b'<svg xmlns="http://www.w3.org/2000/svg" onload="window.DTLABS_PWNED = 8">'
                       b'<script>window.DTLABS_PWNED = 9</script></svg>').decode()
SEARCHED = re.compile(r'"/tmp",\s*"/home",\s*"/work",\s*"/srv"')  # the machine-wide folders attacks search


LAB01 = Target(CHEATS_LAB, "ring_all_reduce", "test_ring_all_reduce", "ring_assumes_divisible.py", (0.0, 3.0),
               (3.0, 3.0))
SYNTHETIC = Target(SYNTHETIC_LAB, "add", "test_add", "ignores_sign.py", (0.0, 2.0), (2.0, 2.0))


def _header(path: Path) -> dict:
    head = {}
    for line in path.read_text().splitlines():
        m = re.match(r"^#\s*(attack|defended-by|needs|tamper|links|ships|markdown)\s*:\s*(.*)$", line)
        if m:
            head[m.group(1)] = m.group(2).strip()
        elif not line.startswith("#"):
            break
    return head


@dataclass(frozen=True)
class Run:
    """One corpus: the sandbox mode, the lab it is graded against, and which attacks (``"all"``; ``"needs"``: those
    that need Lab 01's own code; ``"rest"``: every other one)."""

    mode: str
    target: Target
    which: str = "all"

    @property
    def name(self) -> str:
        return f"{self.mode}-{self.target.lab}" + ("" if self.which == "all" else f"-{self.which}")


def _corpus(run: Run) -> list[Path]:
    """The attacks of ``run``. In the fallback, only those whose defence depends on the sandbox mode (not `split`
    alone: that is the same code in both)."""
    def in_fallback(head):  # split and files: the same code with or without bubblewrap
        return head.get("defended-by", "").replace(" ", "") not in ("split", "files")

    def wanted(head):
        if run.which != "all" and bool(head.get("needs")) != (run.which == "needs"):
            return False
        return run.mode == "bwrap" or in_fallback(head)

    return [p for p in CHEATS if wanted(_header(p))]


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


def _grade_corpus(root: Path, run: Run, monkeypatch) -> dict:
    mode, target = run.mode, run.target
    lab = target.lab
    target.course(root)
    rel = nbformat.read(str(root / "labs" / lab / f"{lab}.ipynb"), as_version=4)
    src = nbformat.read(str(root / "solutions" / lab / f"{lab}.ipynb"), as_version=4)
    honest = target.known_wrong(root)
    search_root = None
    if mode == "fallback":  # the course, its templates and scratch courses, and nothing else, are what attacks find
        search_root, tmp = root.parent, root.parent / "tmp"  # side by side, as a course and /tmp are
        tmp.mkdir()
        monkeypatch.setenv("TMPDIR", str(tmp))
        monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    grading.submit(root, "honest", lab, _cut(grading.fill_solutions(rel, src, {target.answer: honest.source}),
                                             target.test))
    for path in _corpus(run):
        head = _header(path)
        nb = grading.fill_solutions(rel, src, {target.answer: honest.source + "\n\n\n" + target.attack(path, search_root)})
        if head.get("markdown"):  # a cell of its own after the answer, with an SVG attachment that holds script
            at = next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == target.answer)
            nb.cells.insert(at + 1, new_markdown_cell(head["markdown"], attachments={"pwn.svg": {"image/svg+xml": SVG}}))
        if head.get("tamper"):
            for cell in nb.cells:
                meta = cell.metadata.get("nbgrader", {})
                if meta.get("grade_id") == target.test:
                    cell.source = "pass"
                    meta.update(solution=True, locked=False)
        notebook = grading.submit(root, f"cheat_{path.stem}", lab, _cut(nb, target.test))
        _beside(notebook.parent, head, target)
    # the victim, graded last, ships helper modules beside its notebook (one named numpy.py) and uses one
    victim = grading.fill_solutions(rel, src)
    for cell in victim.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == target.answer:
            cell.source += "\n\n\nimport utils\nassert utils.HELPER == 1"
    folder = grading.submit(root, "zz_victim", lab, _cut(victim, target.test)).parent
    (folder / "utils.py").write_text("HELPER = 1\n")
    (folder / "numpy.py").write_text("HELPER = 2  # a student's own module, named like a library\n")
    before = _tree_digest(root)
    repo_before = _tree_digest(REPO)
    PWNED.unlink(missing_ok=True)
    token = uuid.uuid4().hex
    monkeypatch.setenv(TEST_TOKEN_VAR, token)
    monkeypatch.setenv("DTLABS_MEMORY_MB", "4096")
    monkeypatch.setenv("DTLABS_MAX_PROCS", "64")
    monkeypatch.setenv("DTLABS_DISK_MB", "256")
    if mode == "fallback":
        monkeypatch.setenv("DTLABS_SANDBOX", "off")
    lines = []
    code = grading.grade([lab], course_root=root, jobs=2, feedback=False, out=lines.append, progress=False)
    repo_after = _tree_digest(REPO)
    assert_no_leftovers(token)
    return {"code": code, "lines": lines, "before": before, "after": _tree_digest(root), "repo_before": repo_before,
            "repo_after": repo_after}


# Under pytest-xdist one worker grades a corpus and runs its tests (module docstring: which corpora run when).
FULL = os.environ.get("DTLABS_FULL", "") not in ("", "0")
if not sandbox.bwrap_path():
    RUNS = [Run("fallback", LAB01)]
elif FULL:
    RUNS = [Run("bwrap", LAB01), Run("fallback", LAB01), Run("fallback", SYNTHETIC)]
else:
    RUNS = [Run("bwrap", LAB01, "needs"), Run("bwrap", SYNTHETIC, "rest"), Run("fallback", SYNTHETIC)]


@pytest.fixture(scope="module", params=[pytest.param(r, id=r.name, marks=pytest.mark.xdist_group(f"cheats-{r.name}"))
                                        for r in RUNS])
def corpus(request, tmp_path_factory):
    run = request.param
    mp = pytest.MonkeyPatch()
    root = tmp_path_factory.mktemp(f"cheats-{run.mode}") / "course"
    root.mkdir()
    try:
        result = _grade_corpus(root, run, mp)
    finally:
        mp.undo()
    result.update(root=root, run=run)
    return result


def _scores(corpus, student):
    return grading.cell_scores(corpus["root"], corpus["run"].target.lab, student)


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_the_honest_answer_underneath_scores_zero_and_the_victim_full_marks(corpus):
    t = corpus["run"].target
    honest, victim = _scores(corpus, "honest"), _scores(corpus, "zz_victim")
    assert honest.get(t.test) == t.honest_score, (
        f"the honest wrong answer should score {t.honest_score} on {t.test}: {honest}\n" + "\n".join(corpus["lines"]))
    assert victim.get(t.test) == t.full_score, (
        f"the victim graded after every attacker lost points: {victim}\n" + "\n".join(corpus["lines"]))


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_no_cheat_gains_anything(corpus):
    """Every cheat of this corpus against the honest answer underneath it, cell by cell; the failure names each
    cheat that gained and its grading line."""
    honest = _scores(corpus, "honest")
    honest_total = sum(s for s, _ in honest.values())
    gains = []
    for path in _corpus(corpus["run"]):
        got = _scores(corpus, f"cheat_{path.stem}")
        gained = {gid: s for gid, s in got.items() if s[0] > honest.get(gid, (0, 0))[0]}
        line = next((x for x in corpus["lines"] if f"cheat_{path.stem}/" in x), "(no line)")
        if gained:
            gains.append(f"{path.stem} gained {gained}: {line}")
        said = re.match(r"\s*cheat_\S+: ([0-9.]+)/", line)  # what the instructor reads (and outcomes record)
        if said and float(said.group(1)) > honest_total:
            gains.append(f"{path.stem}'s grade line shows more than the honest answer's {honest_total:g}: {line}")
    assert not gains, (f"[{corpus['run'].mode}, {corpus['run'].target.lab}] cheats gained points over the honest answer "
                       f"{honest}:\n" + "\n".join(gains))


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
        for sub in gb.assignment_submissions(corpus["run"].target.lab):
            for nb in sub.notebooks:
                manual = [g.name for g in nb.grades if g.manual_score is not None]
                assert not manual, f"{sub.student.id} has manual scores nobody gave: {manual}"


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_no_hidden_test_reaches_a_cheats_output(corpus):
    t = corpus["run"].target
    src = nbformat.read(str(corpus["root"] / "solutions" / t.lab / f"{t.lab}.ipynb"), as_version=4)
    hidden = [line.strip() for c in src.cells for line in c.source.split("### BEGIN HIDDEN TESTS")[1:]
              for line in line.split("### END HIDDEN TESTS")[0].splitlines() if len(line.strip()) > 20]
    assert hidden and (t.lab != SYNTHETIC_LAB or any(HIDDEN_SOURCE in h for h in hidden))
    for path in _corpus(corpus["run"]):
        nb_path = corpus["root"] / "grader" / "work" / "autograded" / f"cheat_{path.stem}" / t.lab / f"{t.lab}.ipynb"
        if not nb_path.is_file():
            continue
        nb = nbformat.read(str(nb_path), as_version=4)
        answers = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == t.answer]
        text = "".join(str(o) for c in answers for o in c.get("outputs", []))
        leaked = [h for h in hidden if h in text]
        assert not leaked, f"[{corpus['run'].mode}, {t.lab}] {path.stem} printed a hidden test line: {leaked[0]}"


def _autograded(corpus, path: Path):
    lab = corpus["run"].target.lab
    nb_path = corpus["root"] / "grader" / "work" / "autograded" / f"cheat_{path.stem}" / lab / f"{lab}.ipynb"
    return nbformat.read(str(nb_path), as_version=4) if nb_path.is_file() else None


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_nothing_a_cheat_wrote_can_run_in_a_page(corpus):
    """autograded/ (what the formgrader and feedback render) holds no HTML that could run: every markdown cell's
    rendering passes the allow-list unchanged, attachments are raster images, outputs render as text or rasters.
    tests/test_browser_formgrader.py opens such a submission in the formgrader and its feedback in Chromium."""
    from lab_utils.grading.boundary.inert import RASTER, inert_markdown, render_markdown

    for path in _corpus(corpus["run"]):
        nb = _autograded(corpus, path)
        if nb is None:
            continue
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                assert inert_markdown(cell.source, cell.get("attachments")), (path.stem, cell.source)
                assert "<script" not in render_markdown(cell.source, cell.get("attachments")), (path.stem, cell.source)
            for bundle in (cell.get("attachments") or {}).values():
                assert set(bundle) <= set(RASTER), (path.stem, set(bundle))
            for o in cell.get("outputs", []):
                live = set(o.get("data", {})) & {"application/javascript", "image/svg+xml", "text/markdown"}
                assert not live, (path.stem, live)
                assert "<script" not in str(o.get("data", {}).get("text/html", "")), (path.stem, o)
    if "script_in_markdown" in {p.stem for p in _corpus(corpus["run"])}:
        nb = _autograded(corpus, REPO / "grader" / "cheats" / "script_in_markdown.py")
        assert nb is not None and any("DTLABS-MARKDOWN" in c.source for c in nb.cells if c.cell_type == "markdown"), \
            "the cheat's markdown cell should reach autograded/, shown as text"


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_nothing_student_code_said_under_a_hidden_call_reaches_an_output(corpus):
    """From the first cell with hidden tests on, a cell shows what the grader composed: never a print, an exception's
    message or a traceback of the student's code (grader/cheats/hidden_args_in_exception.py spells each call's
    arguments out, base64, after DTLEAK), neither in autograded/ nor in the feedback made from it, nor in the messages
    Gradescope and the report read (cells.messages)."""
    from lab_utils.grading.export import cells
    from lab_utils.grading.feedback import HideHiddenTests

    t = corpus["run"].target
    hidden_ids = {c.grade_id for c in cells.graded_cells(cells.source_notebook(corpus["root"], t.lab)) if c.hidden}

    def after_hidden(nb):
        first = next((i for i, c in enumerate(nb.cells)
                      if c.metadata.get("nbgrader", {}).get("grade_id") in hidden_ids), len(nb.cells))
        return "".join(str(o) for c in nb.cells[first:] for o in c.get("outputs", []))

    for path in _corpus(corpus["run"]):
        nb = _autograded(corpus, path)
        if nb is None:
            continue
        text = after_hidden(nb)
        assert "DTLEAK" not in text, f"{path.stem}: student text under a hidden call reached autograded/: {text[:2000]}"
        said = cells.messages(nb, [])
        assert not any("DTLEAK" in m for m in said.values()), (path.stem, said)
        shown, _ = HideHiddenTests().preprocess(nb, {})
        text = after_hidden(shown)
        assert "DTLEAK" not in text, f"{path.stem}: student text under a hidden call reached feedback: {text[:2000]}"
    if "hidden_args_in_exception" in {p.stem for p in _corpus(corpus["run"])}:
        said = cells.messages(_autograded(corpus, REPO / "grader" / "cheats" / "hidden_args_in_exception.py"), [])
        assert any("hidden test" in said.get(g, "") for g in hidden_ids), said  # the grader's own words instead


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_limits_and_reasons_are_reported(corpus):
    lines = "\n".join(corpus["lines"])
    graded = {p.stem for p in _corpus(corpus["run"])}
    if "memory_hog" in graded:
        assert re.search(r"cheat_memory_hog/.*memory limit", lines), lines
    if "fork_flood" in graded:
        assert re.search(r"cheat_fork_flood/.*process limit", lines), lines
    if "tamper_test_cell" in graded:
        assert re.search(rf"cheat_tamper_test_cell/.*tampered test cell {corpus['run'].target.test}", lines), lines
    if "disk_flood" in graded:
        assert re.search(r"cheat_disk_flood/.*disk limit", lines), lines
    if "huge_frame" in graded:  # refused unread, not read and then found too big; the size it declared is not echoed
        assert re.search(r"cheat_huge_frame/.*an answer over the limit of \d+ MB \(refused unread\)", lines), lines
        assert "1500000000" not in lines, lines
    if "links_to_the_course" in graded:
        assert re.search(r"cheat_links_to_the_course/.*solution\.ipynb \(a symbolic link\)", lines), lines
    if corpus["run"].mode == "fallback":  # the guard, not luck, undid them: each line names what was put back
        assert "graded one at a time" in lines, "--jobs 2 without bubblewrap must say it grades one at a time"
        assert re.search(r"cheat_gradebook_write/.*put back\): .*gradebook\.db", lines), lines
        assert re.search(r"cheat_overwrite_victims/.*put back\): .*submitted/", lines), lines
        assert not re.search(r"(honest|zz_victim)/.*put back", lines), "an honest submission was said to change files"


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_only_the_notebook_comes_back_to_the_course(corpus):
    """What a submission held beside its notebook (links, shipped modules) never reaches autograded/ or feedback."""
    lab = corpus["run"].target.lab
    autograded = corpus["root"] / "grader" / "work" / "autograded"
    extra = {str(p.relative_to(autograded)) for p in autograded.rglob("*") if p.name != f"{lab}.ipynb" and not p.is_dir()}
    links = {str(p.relative_to(autograded)) for p in autograded.rglob("*") if p.is_symlink()}
    assert not extra and not links, f"autograded/ holds more than the notebooks: {sorted(extra | links)}"


def test_every_attack_is_graded_with_the_sandbox_on_every_push():
    """Splitting the corpus between Lab 01 and the synthetic lab must not drop an attack, and what an attack says it
    needs of Lab 01 it gets there."""
    bwrap = [r for r in RUNS if r.mode == "bwrap"]
    if not bwrap:
        pytest.skip("no bubblewrap here: make test grades the fallback against Lab 01")
    graded = [p for r in bwrap for p in _corpus(r)]
    assert sorted(graded) == CHEATS, "attacks graded twice or not at all with bubblewrap: " + ", ".join(
        sorted({p.stem for p in CHEATS} ^ {p.stem for p in graded}))
    for r in bwrap:
        for p in _corpus(r):
            if _header(p).get("needs"):
                assert r.target == LAB01, f"{p.stem} needs Lab 01 ({_header(p)['needs']}) but is graded against {r.target.lab}"
