"""Every repository path a document names exists: the docs (*.md, but CHANGELOG.md: history names what was); the
comments and docstrings of the package, the tests, the benchmarks, the course's grader files, the Makefile and CI's
scripts; the labs' markdown and comments.

What counts as a path:

- a slash path that starts at a top-level folder (``lab_utils/...``, ``grader/...``, ``tests/...``, ``.ci/...``) or at
  a subpackage of ``lab_utils`` (``grading/quality/swaps.py``, ``boundary/files.py``: resolved inside ``lab_utils``);
  a trailing ``/`` names a folder, ``x.py`` a module, and a package folder named without the slash resolves too;
  placeholders (``NN_topic``, ``<student>``, ``LAB``, ``*``) end the part that is checked;
- a dotted module name (``lab_utils.launcher.relay``, ``lab_utils.grading.export.canvas.CanvasExporter``): its longest
  module or package prefix must exist, and the next name must be defined there;
- a section reference: "ARCHITECTURE.md, section N", "ARCHITECTURE.md §N" and, inside ARCHITECTURE.md, "§N" need a
  section numbered N; ``SOME.md, "Title"`` needs a heading with that title in SOME.md.

What the course writes when it runs (``grader/work/``, ``benchmarks/results/``) is not in a checkout and is not checked.
"""
from __future__ import annotations

import ast
import io
import json
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

TOP = ("lab_utils", "grader", "tests", "solutions", "labs", "benchmarks", ".ci", ".github")
SUBPACKAGES = ("launcher", "labkit", "grading", "boundary", "export", "split", "quality", "default_config")
RUNTIME = ("grader/work", "benchmarks/results")  # git-ignored folders the course writes when it runs

PATH_RE = re.compile(r"(?<![\w.$/-])((?:%s)/[\w./<>*{}-]*)" % "|".join(re.escape(t) for t in TOP + SUBPACKAGES))
DOTTED_RE = re.compile(r"(?<![\w./-])(lab_utils(?:\.\w+)+)")
SECTION_RE = re.compile(r"ARCHITECTURE\.md(?:,\s*|\s+)(?:section\s+|§\s*)(\d+)")
LOCAL_SECTION_RE = re.compile(r"§\s*(\d+)")
TITLED_RE = re.compile(r"([\w./-]*\w\.md),\s+\"([^\"]+)\"")


def _documents() -> list[Path]:
    docs = sorted(p for p in ROOT.glob("*.md") if p.name != "CHANGELOG.md")  # history names what was there then
    for folder in ("grader", "benchmarks", "tests", "solutions", "lab_utils", ".ci"):
        docs += sorted(p for p in (ROOT / folder).rglob("*.md") if "work" not in p.relative_to(ROOT).parts[:2])
    return docs


def _sources() -> list[Path]:
    """Files whose comments and docstrings are checked (Python: only those; scripts: their # lines)."""
    files: list[Path] = []
    for folder in ("lab_utils", "tests", "benchmarks", "grader", ".ci", ".github"):
        for p in sorted((ROOT / folder).rglob("*")):
            rel = p.relative_to(ROOT).parts
            if not p.is_file() or "__pycache__" in rel or rel[:2] == ("grader", "work"):
                continue
            if p == Path(__file__).resolve():
                continue  # this file's own examples are planted on purpose
            if p.suffix in (".py", ".sh", ".sbatch", ".toml", ".yml", ".yaml", ".txt", ""):
                files.append(p)
    return files + [ROOT / "Makefile", ROOT / "pyproject.toml"]


def _python_prose(text: str) -> list[tuple[int, str]]:
    """The comments and docstrings of a Python source, each with the line it starts on."""
    parts: list[tuple[int, str]] = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT:
                parts.append((tok.start[0], tok.string))
        tree = ast.parse(text)
    except (tokenize.TokenError, SyntaxError):
        return [(1, text)]
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                parts.append((node.body[0].lineno, doc))
    return parts


def _prose(path: Path) -> list[tuple[int, str]]:
    """What a file says in words, as (first line, text) pieces: all of a document, a source's comments."""
    text = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix == ".md":
        return [(1, text)]
    if path.suffix == ".py":
        return _python_prose(text)
    return [(n, line[line.index("#"):]) for n, line in enumerate(text.splitlines(), 1) if "#" in line]


def _placeholder(part: str) -> bool:
    return (part in ("", ".", "...") or any(c in part for c in "<>*{}") or "NN" in part or "…" in part
            or (part.isupper() and len(part) > 1) or part.startswith("NN_"))


def path_problem(raw: str) -> str | None:
    """Why the slash path ``raw`` names nothing in the repository, or None when it does."""
    raw = raw.rstrip(".,;:)")
    folder = raw.endswith("/")
    parts = raw.strip("/").split("/")
    kept: list[str] = []
    for part in parts:
        if _placeholder(part):
            folder = True  # what is checked is the folder the placeholder lives in
            break
        kept.append(part)
    if not kept:
        return None
    rel = "/".join(kept)
    if rel in RUNTIME or any(rel.startswith(r.rstrip("/") + "/") for r in RUNTIME):
        return None
    bases = [ROOT] if kept[0] in TOP else [ROOT / "lab_utils", ROOT / "lab_utils" / "grading"]
    for base in bases:
        target = base / rel
        if folder and target.is_dir():
            return None
        if not folder and (target.is_file() or target.is_dir()):
            return None
    stem, dot, attr = kept[-1].partition(".")
    if dot and not folder and attr.isidentifier() and attr not in ("py", "md", "sh", "txt", "toml", "json"):
        module = "/".join(kept[:-1] + [stem + ".py"])  # `boundary/sandbox.require`: a name in a module
        for base in bases:
            if (base / module).is_file() and _defines((base / module).read_text(), attr):
                return None
    return "no such " + ("folder" if folder else "file")


def _defines(source: str, name: str) -> bool:
    """``name`` is bound at the top of a module or in a class of it: defined, assigned or imported (a package's
    ``__init__`` re-exports over several lines)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return re.search(r"(?m)^\s*(?:def|class|async def)\s+%s\b|\b%s\s*=" % ((re.escape(name),) * 2),
                         source) is not None
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return True
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any(
                (a.asname or a.name.split(".")[0]) == name for a in node.names):
            return True
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and node.id == name:
            return True
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            return True
    return False


def dotted_problem(raw: str) -> str | None:
    """Why the dotted name ``raw`` (``lab_utils.x.y[.Name]``) names nothing, or None when it does."""
    parts = raw.rstrip(".").split(".")
    base, source, rest = ROOT, "", []
    for i, part in enumerate(parts):
        if (base / part / "__init__.py").is_file():
            base = base / part
            source = (base / "__init__.py").read_text()
        elif (base / f"{part}.py").is_file():
            source, rest = (base / f"{part}.py").read_text(), parts[i + 1:]
            break
        else:
            rest = parts[i:]
            break
    if not rest or rest[0].startswith("__"):
        return None
    if _defines(source, rest[0]):
        return None
    return f"{rest[0]!r} is not defined in {'.'.join(parts[:len(parts) - len(rest)])}"


def _sections(md: Path) -> tuple[set[str], set[str]]:
    numbers, titles = set(), set()
    for line in md.read_text().splitlines():
        m = re.match(r"#+\s+(?:(\d+)\.\s+)?(.*?)\s*$", line)
        if m:
            if m.group(1):
                numbers.add(m.group(1))
            titles.add(m.group(2).strip().lower())
            titles.add(re.sub(r"^\d+\.\s*", "", m.group(2)).strip().lower())
    return numbers, titles


def problems_in(name: str, text: str, local_sections: set[str] | None = None, first_line: int = 1) -> list[str]:
    """Every dangling path, module name or section reference in ``text``: the prose of file ``name`` from line
    ``first_line`` on."""
    found = []
    arch_numbers, _ = _sections(ROOT / "ARCHITECTURE.md")
    for lineno, line in enumerate(text.splitlines(), first_line):
        for m in PATH_RE.finditer(line):
            why = path_problem(m.group(1))
            if why:
                found.append(f"{name}:{lineno}: {m.group(1)} ({why})")
        for m in DOTTED_RE.finditer(line):
            why = dotted_problem(m.group(1))
            if why:
                found.append(f"{name}:{lineno}: {m.group(1)} ({why})")
        for m in SECTION_RE.finditer(line):
            if m.group(1) not in arch_numbers:
                found.append(f"{name}:{lineno}: ARCHITECTURE.md section {m.group(1)} (no such section)")
        if local_sections is not None:
            for m in LOCAL_SECTION_RE.finditer(line):
                if m.group(1) not in local_sections:
                    found.append(f"{name}:{lineno}: §{m.group(1)} (no such section here)")
        for m in TITLED_RE.finditer(line):
            doc = ROOT / m.group(1)
            if not doc.is_file():
                continue  # a dangling document name is the path check's to report
            title = m.group(2).strip().lower()
            if not any(t == title or t.startswith(title + ":") or t.startswith(title + " ") for t in _sections(doc)[1]):
                found.append(f"{name}:{lineno}: {m.group(1)}, \"{m.group(2)}\" (no such heading)")
    return found


def _notebook_prose(path: Path) -> list[tuple[str, str]]:
    """A lab source's markdown cells and its code cells' comments and docstrings, each named by its cell id."""
    cells = json.loads(path.read_text())["cells"]
    return [(f"{path.relative_to(ROOT)}#{c.get('id', i)}", "".join(c["source"]) if c["cell_type"] == "markdown"
             else "\n".join(text for _, text in _python_prose("".join(c["source"])))) for i, c in enumerate(cells)]


@pytest.mark.parametrize("kind", ["documents", "sources", "notebooks"])
def test_every_repository_path_named_in_the_docs_exists(kind):
    found = []
    if kind == "notebooks":
        notebooks = sorted(ROOT.glob("solutions/*/*.ipynb"))
        assert notebooks, "no lab source to check: the glob is wrong"
        for path in notebooks:
            for name, text in _notebook_prose(path):
                found += problems_in(name, text)
    files = {"documents": _documents, "sources": _sources}.get(kind, list)()
    assert files or kind == "notebooks", "no file to check: the globs are wrong"
    for path in files:
        rel = str(path.relative_to(ROOT))
        local = _sections(path)[0] if path.name == "ARCHITECTURE.md" else None
        for first_line, text in _prose(path):
            found += problems_in(rel, text, local, first_line)
    assert not found, "paths, names and sections the docs name that do not exist:\n  " + "\n  ".join(found)


@pytest.mark.parametrize("text, expected", [
    ("see `lab_utils/grading/swaps.py`", "lab_utils/grading/swaps.py (no such file)"),
    ("as `grading/swaps.py` does", "grading/swaps.py (no such file)"),
    ("built by `.ci/no-such-script`", ".ci/no-such-script (no such file)"),
    ("in `lab_utils.grading.no_such_module`", "lab_utils.grading.no_such_module"),
    ("`lab_utils.launcher.launch.no_such_function`", "'no_such_function' is not defined"),
    ("`lab_utils.no_such_name`", "'no_such_name' is not defined in lab_utils"),
    ("`boundary/sandbox.no_such_function`", "boundary/sandbox.no_such_function (no such file)"),
    ("ARCHITECTURE.md, section 99", "section 99"),
    ("ARCHITECTURE.md §42", "section 42"),
    ('grader/README.md, "No such heading"', "no such heading"),
])
def test_the_check_catches_a_dangling_reference(text, expected):
    found = problems_in("planted.md", text)
    assert len(found) == 1 and expected in found[0], found


@pytest.mark.parametrize("text", [
    "`lab_utils/grading/quality/swaps.py`, `grading/quality/swaps.py`, `quality/swaps.py`",
    "`lab_utils/launcher/`, `lab_utils/launcher`, `lab_utils.launcher.launch.set_remote`, `lab_utils.launcher`",
    "`solutions/NN_topic/NN_topic.ipynb`, `grader/known_wrong/<lab>/`, `grader/work/submitted/<student>/`",
    "`grader/cheats/*.py`, `labs/01_ddp_setup/01_ddp_setup.ipynb`, `.ci/run`",
    'ARCHITECTURE.md, section 7; grader/README.md, "Running the course"; grader/README.md, "Grades out"',
    "`lab_utils.launch`, `lab_utils.__file__`, `boundary/sandbox.require`",
])
def test_the_check_accepts_what_exists(text):
    assert problems_in("planted.md", text) == []
