"""The package's shape: three layers whose imports point one way, no import circle, nothing of grading in a notebook,
no folder of more than 12 modules and no module of more than 400 lines (each cut along its jobs instead).

The import graph is read from the sources (every ``import`` and ``from ... import`` anywhere in a module, the
lazy ones inside functions included), so a circle that only closes at run time is found too.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "lab_utils"
LAYERS = ("launcher", "labkit", "grading")
# which layer may import which (besides itself and the shared top-level modules)
ALLOWED = {"launcher": set(), "labkit": {"launcher"}, "grading": {"launcher", "labkit"}}
MAX_MODULES_PER_FOLDER = 12
MAX_LINES_PER_MODULE = 400


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PKG.rglob("*.py")}


def _imports(path: Path, name: str, known: set) -> set[str]:
    """The lab_utils modules ``path`` imports, wherever the import statement is."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        for t in targets:
            while t and t not in known:  # `from pkg import name` names a module or an attribute of pkg
                t = t.rpartition(".")[0]
            if t and t.startswith("lab_utils") and t != name:
                found.add(t)
    return found


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    known = set(mods)
    graph = {}
    for name, path in mods.items():
        # importing a.b.c runs a/__init__ and a/b/__init__ too: not an edge of this module's own making
        graph[name] = {t for t in _imports(path, name, known) if not name.startswith(t + ".")}
    return graph


def _cycle(graph) -> list[str] | None:
    state, stack = {}, []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def _layer(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def test_the_import_graph_has_no_cycle_lazy_imports_included():
    cycle = _cycle(_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_a_lazy_circle():
    """The test above could not fail if the graph missed imports inside functions: it does not."""
    graph = _graph()
    assert "lab_utils.launcher.zygote" in graph["lab_utils.launcher.group"], "a lazy import was not seen"
    graph["lab_utils.launcher.worker"] = graph["lab_utils.launcher.worker"] | {"lab_utils.launcher.group"}
    assert _cycle(graph) is not None


def test_imports_point_one_way():
    bad = []
    for name, targets in _graph().items():
        src = _layer(name)
        for t in targets:
            dst = _layer(t)
            if src and dst and dst != src and dst not in ALLOWED[src]:
                bad.append(f"{name} imports {t}")
            if src is None and name != "lab_utils.cli" and dst in ("grading", "labkit"):
                bad.append(f"{name} (shared) imports {t}")
    assert not bad, "imports against the layering:\n" + "\n".join(sorted(bad))


def test_no_folder_holds_more_than_twelve_modules():
    for folder in [PKG, *(p for p in PKG.rglob("*") if p.is_dir() and p.name != "__pycache__")]:
        modules = [p for p in folder.glob("*.py") if p.name != "__init__.py"]
        assert len(modules) <= MAX_MODULES_PER_FOLDER, f"{folder}: {len(modules)} modules"


def _too_long(lines_of: dict) -> list[str]:
    """What breaks the length bound, given {path relative to lab_utils/: its number of lines}."""
    return [f"{rel}: {n} lines (at most {MAX_LINES_PER_MODULE})" for rel, n in sorted(lines_of.items())
            if n > MAX_LINES_PER_MODULE]


def _lines_of() -> dict:
    return {p.relative_to(PKG).as_posix(): len(p.read_text().splitlines()) for p in PKG.rglob("*.py")}


def test_no_module_is_longer_than_four_hundred_lines():
    bad = _too_long(_lines_of())
    assert not bad, "modules over the length bound (cut them along their jobs):\n" + "\n".join(bad)


def test_the_length_bound_would_have_caught_the_uncut_relay_and_proxy():
    """The test above could fail: relay.py (730 lines) and proxy.py (562) before they were cut break it."""
    lines = _lines_of()
    assert _too_long({**lines, "launcher/relay.py": 730, "grading/split/proxy.py": 562}) == [
        "grading/split/proxy.py: 562 lines (at most 400)", "launcher/relay.py: 730 lines (at most 400)"]


@pytest.mark.parametrize("statement", ["import lab_utils", "from lab_utils import launch, run_as_student, Traffic",
                                       "import lab_utils; lab_utils.load_ipython_extension.__call__"])
def test_a_notebook_import_loads_no_grading_code(statement):
    code = (f"{statement}\nimport sys\n"
            "print(sorted(m for m in sys.modules if m.startswith(('lab_utils.grading', 'nbgrader', 'lab_utils.labkit'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", f"{statement!r} loaded: {out}"


def test_the_percent_dist_magics_load_no_grading_code():
    code = ("from IPython.core.interactiveshell import InteractiveShell\nimport sys\n"
            "shell = InteractiveShell.instance()\nshell.run_line_magic('load_ext', 'lab_utils')\n"
            "print(sorted(m for m in sys.modules if m.startswith(('lab_utils.grading', 'nbgrader'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]", out
