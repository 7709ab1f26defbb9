"""``dtlabs mutate LAB``: mutation testing of a lab's tests, for instructors writing labs.

A test suite that gives the solution full marks and the release zero can still let real mistakes through.
This module makes *single-change mutants* of every solution region (the code between ``### BEGIN SOLUTION`` and
``### END SOLUTION``), grades each one through the same split execution as a student's submission (the solution
with one region mutated, the hidden tests in place), and reports the mutants that keep full marks: each
*survivor* is a mistake the tests do not catch, or an equivalent change.

Operators (each mutant applies exactly one):

- ``binop``: arithmetic swaps (``+``/``-``, ``*``/``/``, ``//``->``/``, ``%``->``//``, ``**``->``*``), in ``x += ...``
- ``compare``: comparison swaps (``<``/``<=``, ``>``/``>=``, ``==``/``!=``, ``is``/``is not``, ``in``/``not in``)
- ``boolop``: ``and``/``or``
- ``const``: an integer constant off by one (``n+1``, ``n-1``)
- ``range``: a ``range(...)`` bound off by one
- ``minmax``: ``min``/``max`` swapped
- ``drop``: a statement replaced by ``pass``
- ``swap-args``: the first two positional arguments of a call swapped
- ``reduce-op``: a wrong ``ReduceOp`` (``SUM``/``AVG``, ``MAX``/``MIN``, ...)
- ``no-call``: a call to ``no_sync``/``set_epoch``/``zero_grad``/``all_reduce``/``wait``/``broadcast``/... removed

Every mutant has a stable id (a hash of the solution cell, the operator, the mutated source text and which
occurrence of it), so an *equivalent* mutant (one no test could catch, because the program means the same) can be
accepted in ``grader/mutants/NN_topic.toml`` with a reason, and is then neither graded nor counted::

    [[accepted]]
    id = "3f2a9c01d4"
    reason = "x.min() and x.min().item() compare the same way against 0.0"

All mutants of one lab are graded in ONE swap session (``lab_utils/grading/quality/swaps.py``): the solution runs once,
each mutant swaps its cell in, re-runs the cells from there on until a test loses points (killed) or the last test
passes (survived), and is put back; the unmutated solution before the first mutant and after the last is the
control.
"""
from __future__ import annotations

import ast
import copy
import difflib
import hashlib
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from lab_utils import grading
from lab_utils.status import Status

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
REMOVABLE_CALLS = ("no_sync", "set_epoch", "zero_grad", "all_reduce", "wait", "broadcast", "barrier",
                   "reduce_scatter", "all_gather", "reduce", "step", "synchronize")
_BINOP_SWAPS = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.FloorDiv: ast.Div,
                ast.Mod: ast.FloorDiv, ast.Pow: ast.Mult}
_CMP_SWAPS = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
              ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In}
_REDUCE_SWAPS = {"SUM": ("AVG", "MAX"), "AVG": ("SUM",), "MAX": ("MIN", "SUM"), "MIN": ("MAX",),
                 "PRODUCT": ("SUM",)}
_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%", ast.Pow: "**",
        ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=", ast.Is: "is",
        ast.IsNot: "is not", ast.In: "in", ast.NotIn: "not in", ast.And: "and", ast.Or: "or"}


@dataclass
class Mutant:
    id: str
    grade_id: str     # the solution cell it mutates
    operator: str     # e.g. "binop", "drop"
    description: str  # e.g. "+ -> -"
    line: int         # 1-based line in the solution cell (markers included)
    source: str       # the whole mutated cell as a student would submit it (solution markers stripped)
    diff: str         # unified diff against the solution


# ------------------------------------------------------------------------------------------ generation
def solution_regions(source: str) -> list[tuple[int, int]]:
    """1-based (first, last) line numbers strictly between each BEGIN/END SOLUTION marker pair."""
    regions, start = [], None
    for i, line in enumerate(source.split("\n"), start=1):
        if line.strip() == BEGIN:
            start = i
        elif line.strip() == END and start is not None:
            if i - 1 > start:
                regions.append((start + 1, i - 1))
            start = None
    return regions


class _Source:
    """A cell's text addressed by ast positions (1-based lines, UTF-8 byte columns)."""

    def __init__(self, text: str):
        self.text = text
        self.lines = text.split("\n")

    def _char(self, lineno, col):
        return len(self.lines[lineno - 1].encode()[:col].decode(errors="ignore"))

    def offset(self, lineno, col) -> int:
        return sum(len(line) + 1 for line in self.lines[: lineno - 1]) + self._char(lineno, col)

    def segment(self, node) -> str:
        return self.text[self.offset(node.lineno, node.col_offset):self.offset(node.end_lineno, node.end_col_offset)]

    def replace(self, node, new: str) -> str:
        a = self.offset(node.lineno, node.col_offset)
        b = self.offset(node.end_lineno, node.end_col_offset)
        return self.text[:a] + new + self.text[b:]

    def replace_span(self, start: tuple, end: tuple, new: str) -> str:
        a, b = self.offset(*start), self.offset(*end)
        return self.text[:a] + new + self.text[b:]


def _unparse(node) -> str:
    text = ast.unparse(node)
    return f"({text})" if isinstance(node, (ast.BinOp, ast.BoolOp, ast.Compare)) else text


def _call_name(call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def _candidates(src: _Source, tree, inside):
    """(operator, description, node, replacement text or a callable giving the new cell text) for each change."""
    out = []
    in_fstring = {id(n) for j in ast.walk(tree) if isinstance(j, ast.JoinedStr) for n in ast.walk(j)}
    for node in ast.walk(tree):
        if not hasattr(node, "lineno") or not inside(node) or id(node) in in_fstring:
            continue  # (positions inside f-strings are not reliable before Python 3.12)
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOP_SWAPS:
            new = copy.deepcopy(node)
            new.op = _BINOP_SWAPS[type(node.op)]()
            out.append(("binop", f"{_OPS[type(node.op)]} -> {_OPS[type(new.op)]}", node, _unparse(new)))
        elif isinstance(node, ast.AugAssign) and type(node.op) in _BINOP_SWAPS:
            new = copy.deepcopy(node)
            new.op = _BINOP_SWAPS[type(node.op)]()
            out.append(("binop", f"{_OPS[type(node.op)]}= -> {_OPS[type(new.op)]}=", node, ast.unparse(new)))
        elif isinstance(node, ast.Compare):
            for i, op in enumerate(node.ops):
                if type(op) in _CMP_SWAPS:
                    new = copy.deepcopy(node)
                    new.ops[i] = _CMP_SWAPS[type(op)]()
                    out.append(("compare", f"{_OPS[type(op)]} -> {_OPS[type(new.ops[i])]}", node, _unparse(new)))
        elif isinstance(node, ast.BoolOp):
            new = copy.deepcopy(node)
            new.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
            out.append(("boolop", f"{_OPS[type(node.op)]} -> {_OPS[type(new.op)]}", node, _unparse(new)))
        elif isinstance(node, ast.Constant) and type(node.value) is int:
            for d in (1, -1):
                out.append(("const", f"{node.value} -> {node.value + d}", node, repr(node.value + d)))
        elif isinstance(node, ast.Attribute) and node.attr in _REDUCE_SWAPS and (
                isinstance(node.value, ast.Attribute) and node.value.attr == "ReduceOp"
                or isinstance(node.value, ast.Name) and node.value.id == "ReduceOp"):
            for other in _REDUCE_SWAPS[node.attr]:
                out.append(("reduce-op", f"ReduceOp.{node.attr} -> ReduceOp.{other}", node,
                            f"{ast.unparse(node.value)}.{other}"))
        elif isinstance(node, ast.Call):
            name = _call_name(node)
            if name == "range" and node.args and not node.keywords:
                stop_i = 0 if len(node.args) == 1 else 1
                literal = isinstance(node.args[stop_i], ast.Constant)  # the const operator covers a literal
                for d in () if literal else (1, -1):
                    new = copy.deepcopy(node)
                    new.args[stop_i] = ast.BinOp(new.args[stop_i], ast.Add() if d > 0 else ast.Sub(), ast.Constant(1))
                    out.append(("range", f"range stop {'+' if d > 0 else '-'} 1", node, ast.unparse(new)))
                if len(node.args) >= 2:
                    new = copy.deepcopy(node)
                    new.args[0] = ast.BinOp(new.args[0], ast.Add(), ast.Constant(1))
                    out.append(("range", "range start + 1", node, ast.unparse(new)))
            if isinstance(node.func, ast.Name) and node.func.id in ("min", "max"):
                other = "max" if node.func.id == "min" else "min"
                out.append(("minmax", f"{node.func.id} -> {other}", node.func, other))
            pos = [a for a in node.args if not isinstance(a, ast.Starred)]
            if len(pos) >= 2 and len(pos) == len(node.args) and src.segment(pos[0]) != src.segment(pos[1]) \
                    and name not in ("min", "max"):  # commutative: swapping changes nothing
                new = copy.deepcopy(node)
                new.args[0], new.args[1] = new.args[1], new.args[0]
                out.append(("swap-args", f"{_call_name(node) or 'call'}(a, b) -> (b, a)", node, ast.unparse(new)))
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                e = item.context_expr
                if isinstance(e, ast.Call) and _call_name(e) in REMOVABLE_CALLS:
                    out.append(("no-call", f"with {_call_name(e)}() removed", e,
                                "__import__('contextlib').nullcontext()"))
        if isinstance(node, ast.stmt) and not isinstance(node, (ast.Pass, ast.FunctionDef, ast.ClassDef,
                                                                    ast.AsyncFunctionDef)):
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
                continue  # a docstring
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and \
                    _call_name(node.value) in REMOVABLE_CALLS:
                out.append(("no-call", f"{_call_name(node.value)}(...) removed", node, "pass"))
            elif not isinstance(node, (ast.If, ast.For, ast.While, ast.With, ast.Try, ast.AsyncFor,
                                       ast.AsyncWith)):
                out.append(("drop", f"statement removed: {ast.unparse(node).splitlines()[0][:60]}", node, "pass"))
    return out


def _mutant_id(grade_id, operator, description, snippet, occurrence) -> str:
    key = "\x1f".join([grade_id, operator, description, " ".join(snippet.split()), str(occurrence)])
    return hashlib.sha1(key.encode()).hexdigest()[:10]


def cell_mutants(grade_id: str, source: str) -> list[Mutant]:
    """Every single-change mutant of the solution regions of one solution cell, in source order."""
    regions = solution_regions(source)
    if not regions:
        return []
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []  # a cell with IPython magics: nothing to mutate safely
    src = _Source(source)

    def inside(node):
        return any(a <= node.lineno and node.end_lineno <= b for a, b in regions)

    original = grading.strip_solution_markers(source)
    seen_sources, counts, mutants = {original}, {}, []
    cands = sorted(_candidates(src, tree, inside), key=lambda c: (c[2].lineno, c[2].col_offset, c[0], c[1]))
    for operator, description, node, new in cands:
        snippet = src.segment(node)
        key = (operator, description, " ".join(snippet.split()))
        occurrence = counts.get(key, 0)
        counts[key] = occurrence + 1
        text = src.replace(node, new)
        student = grading.strip_solution_markers(text)
        if student in seen_sources:
            continue
        try:
            compile(student, f"<{grade_id}>", "exec")
        except SyntaxError:
            continue
        seen_sources.add(student)
        diff = "".join(difflib.unified_diff((original + "\n").splitlines(True), (student + "\n").splitlines(True),
                                            f"{grade_id} (solution)", f"{grade_id} (mutant)", n=1))
        mutants.append(Mutant(_mutant_id(grade_id, operator, description, snippet, occurrence), grade_id, operator,
                              description, node.lineno, student, diff))
    return mutants


def lab_mutants(source_nb) -> list[Mutant]:
    """The mutants of every solution cell of a solutions/ notebook, in notebook order."""
    out = []
    for cell in source_nb.cells:
        meta = grading.course.cell_meta(cell)
        if cell.get("cell_type") == "code" and meta.get("solution"):
            out.extend(cell_mutants(meta["grade_id"], cell["source"]))
    return out


def sample(mutants: list, n: int | None, seed: int) -> list:
    """``n`` of them drawn with ``random.Random(seed)`` (all if n is None or too large), in their original order."""
    if n is None or n >= len(mutants):
        return list(mutants)
    picked = set(random.Random(seed).sample(range(len(mutants)), n))
    return [m for i, m in enumerate(mutants) if i in picked]


# ------------------------------------------------------------------------------------------ accepted
def accepted_path(lab: str, root: Path | str | None = None) -> Path:
    return grading.find_course_root(root) / "grader" / "mutants" / f"{lab}.toml"


def load_accepted(lab: str, root: Path | str | None = None) -> dict:
    """id -> reason of the equivalent mutants accepted for a lab (``grader/mutants/NN_topic.toml``)."""
    import tomllib

    path = accepted_path(lab, root)
    if not path.is_file():
        return {}
    data = tomllib.loads(path.read_text())
    out = {}
    for entry in data.get("accepted", []):
        if not entry.get("id") or not str(entry.get("reason", "")).strip():
            raise ValueError(f"{path}: every [[accepted]] entry needs an id and a reason, got {entry}")
        out[str(entry["id"])] = str(entry["reason"])
    return out


# ------------------------------------------------------------------------------------------ grading
@dataclass
class Report:
    lab: str
    graded: list          # (mutant, killed: bool, scores: dict)
    accepted: list        # mutants skipped as accepted equivalents
    total: int            # mutants generated before sampling (accepted ones excluded)
    control_ok: bool
    control_scores: dict
    seconds: float
    output_tail: str = ""

    @property
    def killed(self) -> int:
        return sum(1 for _, k, _ in self.graded if k)

    @property
    def kill_rate(self) -> float:
        return self.killed / len(self.graded) if self.graded else 1.0

    @property
    def survivors(self) -> list:
        return [m for m, k, _ in self.graded if not k]


def run_mutants(lab: str, mutants: list, *, root: Path | str | None = None, cell_timeout=None):
    """Grade the unmutated solution and every mutant in one swap session (``lab_utils.grading.quality.swaps``): the same
    split execution as ``autograde``, one kernel and sandbox for all. Returns the session's report."""
    from lab_utils.grading.quality.swaps import Swap, check_swaps

    return check_swaps(lab, [Swap(m.id, {m.grade_id: m.source}, first_loss=True) for m in mutants], root=root,
                       cell_timeout=cell_timeout)


def _full_marks(scores: dict) -> bool:
    return bool(scores) and all((s or 0) >= m for s, m in scores.values())


def mutate(lab: str, *, n: int | None = 20, seed: int = 0, root: Path | str | None = None,
           cell_timeout=None) -> Report:
    import nbformat

    root = grading.find_course_root(root)
    src = nbformat.read(str(root / "solutions" / lab / f"{lab}.ipynb"), as_version=4)
    accepted_ids = load_accepted(lab, root)
    every = lab_mutants(src)
    accepted = [m for m in every if m.id in accepted_ids]
    pool = [m for m in every if m.id not in accepted_ids]
    chosen = sample(pool, n, seed)
    start = time.monotonic()
    session = run_mutants(lab, chosen, root=root, cell_timeout=cell_timeout)
    # a mutant is killed when it loses any point (the cells before the mutated one cannot change)
    graded = [(m, not _full_marks(session.results[m.id].scores), session.results[m.id].scores) for m in chosen]
    # the control: the solution before the first mutant and after the last (each mutant's cells are put back)
    control_ok = _full_marks(session.baseline.scores) and _full_marks(session.control.scores) \
        and not session.restore_errors
    why = [f"{gid}: {e}" for res in (session.baseline, session.control) for gid, e in res.errors.items()]
    return Report(lab, graded, accepted, len(pool), control_ok, session.control.scores, time.monotonic() - start,
                  "\n".join(why + session.restore_errors)[-3000:])


def format_report(rep: Report, min_kill: float) -> str:
    lines = [f"dtlabs mutate {rep.lab}: {len(rep.graded)} of {rep.total} mutants graded "
             f"({len(rep.accepted)} accepted as equivalent, not counted) in {rep.seconds:.0f} s"]
    if not rep.control_ok:
        lines.append(f"CONTROL FAILED: the unmutated solution did not get full marks: {rep.control_scores}\n"
                     f"why:\n{rep.output_tail}")
    lines.append(f"{'id':<11}{'cell':<28}{'line':>5}  {'operator':<10}{'result':<9}change")
    for m, killed, scores in rep.graded:
        lost = [g for g, (s, mx) in scores.items() if (s or 0) < mx]
        res = "killed" if killed else "SURVIVED"
        lines.append(f"{m.id:<11}{m.grade_id[:27]:<28}{m.line:>5}  {m.operator:<10}{res:<9}{m.description}"
                     + (f"  [{', '.join(lost)}]" if killed and lost else ""))
    if rep.survivors:
        lines.append("\nSurvivors (a mistake no test catches, or an equivalent change: strengthen the tests, or "
                     f"accept it with a reason in grader/mutants/{rep.lab}.toml):")
        for m in rep.survivors:
            lines.append(f"\n--- mutant {m.id} ({m.operator}: {m.description})\n{m.diff}")
    verdict = "OK" if rep.kill_rate >= min_kill and rep.control_ok else "FAIL"
    lines.append(f"\nkill rate {rep.lab}: {rep.killed}/{len(rep.graded)} = {rep.kill_rate:.0%} "
                 f"(required {min_kill:.0%}): {verdict}")
    return "\n".join(lines)


def main(lab: str, *, n=20, seed=0, min_kill=0.9, root=None, cell_timeout=None, list_only=False,
         stream=None) -> Status:
    """``dtlabs mutate``: DONE when the kill rate reaches ``min_kill`` (and the solution keeps full marks), else
    INCOMPLETE; REFUSED for a lab the course does not have."""
    import nbformat

    stream = stream or sys.stdout
    root = grading.find_course_root(root)
    if lab not in grading.discover_labs(root):
        print(f"no solutions/{lab}/{lab}.ipynb; labs: {grading.discover_labs(root)}", file=sys.stderr)
        return Status.REFUSED
    if list_only:
        src = nbformat.read(str(root / "solutions" / lab / f"{lab}.ipynb"), as_version=4)
        accepted = load_accepted(lab, root)
        pool = [m for m in lab_mutants(src) if m.id not in accepted]
        for m in sample(pool, n, seed):
            print(f"{m.id:<11}{m.grade_id[:27]:<28}{m.line:>5}  {m.operator:<10}{m.description}", file=stream)
        return Status.DONE
    rep = mutate(lab, n=n, seed=seed, root=root, cell_timeout=cell_timeout)
    print(format_report(rep, min_kill), file=stream)
    return Status.DONE if rep.control_ok and rep.kill_rate >= min_kill else Status.INCOMPLETE
