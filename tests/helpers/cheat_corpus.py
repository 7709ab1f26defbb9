"""The cheat corpus as submissions (grader/cheats/, see its README): an honest wrong answer under each attack, and a
victim, submitted into a course of the lab the attacks are graded against. Shared by tests/grading/boundary/test_cheats.py (graded
in-process, per push) and tests/deploy/test_no_namespaces.py (graded as the separate user, namespaces refused)."""
from __future__ import annotations

import base64
import hashlib
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import nbformat
from nbformat.v4 import new_markdown_cell

from helpers import REPO
from helpers.known_wrong import read_known_wrong
from helpers.synthetic import SYNTHETIC_LAB, make_synthetic_course
from lab_utils import grading


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


def beside(folder: Path, head: dict, target: Target) -> None:
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


def header(path: Path) -> dict:
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


def attacks(run: Run) -> list[Path]:
    """The attacks of ``run``. In the fallback, only those whose defence depends on the sandbox mode (not `split`
    alone: that is the same code in both)."""
    def in_fallback(head):  # split and files: the same code with or without bubblewrap
        return head.get("defended-by", "").replace(" ", "") not in ("split", "files")

    def wanted(head):
        if run.which != "all" and bool(head.get("needs")) != (run.which == "needs"):
            return False
        return run.mode == "bwrap" or in_fallback(head)  # the separate user's run grades the fallback's set

    return [p for p in CHEATS if wanted(header(p))]


def tree_digest(root: Path) -> dict:
    """path -> sha256 of every file of the course but its grading work folder."""
    out = {}
    for sub in ("lab_utils", "solutions", "labs", "grader"):
        for p in sorted((root / sub).rglob("*")):
            if p.is_file() and "work" not in p.relative_to(root).parts and "__pycache__" not in p.parts:
                out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def cut(nb, grade_id):
    """Up to the cell the attacks aim at, without the demo cells (which no test depends on, tests/labs/test_labs.py)."""
    nb = grading.without_demos(nb)
    idx = max(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)
    nb.cells = nb.cells[: idx + 1]
    return nb



def submit_corpus(root: Path, run: Run, search_root: Path | None = None) -> None:
    """The course of ``run``'s lab in ``root`` with the honest answer, each attack of ``run`` over it, and the victim
    submitted. ``search_root`` replaces the folders the attacks search (``Target.attack``)."""
    target = run.target
    lab = target.lab
    target.course(root)
    rel = nbformat.read(str(root / "labs" / lab / f"{lab}.ipynb"), as_version=4)
    src = nbformat.read(str(root / "solutions" / lab / f"{lab}.ipynb"), as_version=4)
    honest = target.known_wrong(root)
    grading.submit(root, "honest", lab, cut(grading.fill_solutions(rel, src, {target.answer: honest.source}),
                                             target.test))
    for path in attacks(run):
        head = header(path)
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
        notebook = grading.submit(root, f"cheat_{path.stem}", lab, cut(nb, target.test))
        beside(notebook.parent, head, target)
    # the victim, graded last, ships helper modules beside its notebook (one named numpy.py) and uses one
    victim = grading.fill_solutions(rel, src)
    for cell in victim.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == target.answer:
            cell.source += "\n\n\nimport utils\nassert utils.HELPER == 1"
    folder = grading.submit(root, "zz_victim", lab, cut(victim, target.test)).parent
    (folder / "utils.py").write_text("HELPER = 1\n")
    (folder / "numpy.py").write_text("HELPER = 2  # a student's own module, named like a library\n")
