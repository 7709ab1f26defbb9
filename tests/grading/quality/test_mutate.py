"""``dtlabs mutate`` (lab_utils.grading.quality.mutate): mutant generation (fast, no grading) and one real run on the synthetic lab."""
from __future__ import annotations

import io
import shutil
import time

import nbformat
import pytest
from helpers.synthetic import SYNTHETIC_LAB

from lab_utils import cli, grading
from lab_utils.grading.quality import mutate
from lab_utils.status import Status

CELL = '''def f(x, y, t, model, loss, group=None):
    """A docstring is never mutated."""
    k = 2  # outside the solution region: never mutated
    ### BEGIN SOLUTION
    total = x + y
    if total < 3:
        total -= 1
    for i in range(n):
        pass
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    with model.no_sync():
        loss.backward()
    model.zero_grad()
    return max(torch.sub(x, y), 0) and total
    ### END SOLUTION'''


def _descriptions(source=CELL):
    return {m.description for m in mutate.cell_mutants("f", source)}


def test_regions_are_the_lines_between_the_markers():
    assert mutate.solution_regions(CELL) == [(5, 14)]
    two = "def a():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION\n\ndef b():\n" \
          "    ### BEGIN SOLUTION\n    return 2\n    ### END SOLUTION"
    assert mutate.solution_regions(two) == [(3, 3), (8, 8)]
    assert mutate.solution_regions("x = 1") == []


def test_every_operator_family_makes_its_mutant():
    d = _descriptions()
    for expected in ("+ -> -", "< -> <=", "-= -> +=", "3 -> 4", "3 -> 2", "range stop + 1", "range stop - 1",
                     "ReduceOp.SUM -> ReduceOp.AVG", "ReduceOp.SUM -> ReduceOp.MAX", "with no_sync() removed",
                     "zero_grad(...) removed", "all_reduce(...) removed", "sub(a, b) -> (b, a)", "max -> min",
                     "and -> or", "0 -> 1"):
        assert expected in d, f"no mutant '{expected}' in {sorted(d)}"
    assert any(x.startswith("statement removed: total = x + y") for x in d)


def test_mutants_change_only_the_solution_region_and_compile():
    original = grading.strip_solution_markers(CELL)
    mutants = mutate.cell_mutants("f", CELL)
    assert len(mutants) >= 20
    for m in mutants:
        assert m.source != original
        assert "k = 2  # outside" in m.source and '"""A docstring is never mutated."""' in m.source
        assert mutate.BEGIN not in m.source and mutate.END not in m.source  # submitted as a student would
        compile(m.source, "<mutant>", "exec")
        assert m.diff.startswith("--- f (solution)")
    assert len({m.source for m in mutants}) == len(mutants), "duplicate mutants"


def test_ids_are_stable_unique_and_do_not_depend_on_the_line_numbers():
    a = mutate.cell_mutants("f", CELL)
    b = mutate.cell_mutants("f", CELL)
    assert [m.id for m in a] == [m.id for m in b]
    assert len({m.id for m in a}) == len(a)
    shifted = mutate.cell_mutants("f", "import math\n\n\n" + CELL)  # the same change, three lines further down
    assert {m.id for m in shifted} == {m.id for m in a}
    assert {m.id for m in mutate.cell_mutants("g", CELL)}.isdisjoint({m.id for m in a}), "the cell is in the id"


def test_commutative_min_max_arguments_are_not_swapped():
    assert not any("max(a, b)" in d for d in _descriptions())


def test_sampling_is_deterministic_for_a_seed():
    mutants = mutate.cell_mutants("f", CELL)
    s1 = [m.id for m in mutate.sample(mutants, 5, seed=3)]
    assert s1 == [m.id for m in mutate.sample(mutants, 5, seed=3)]
    assert len(s1) == 5 and s1 != [m.id for m in mutate.sample(mutants, 5, seed=4)]
    order = [m.id for m in mutants]
    assert s1 == sorted(s1, key=order.index), "a sample keeps the notebook order"
    assert len(mutate.sample(mutants, None, 0)) == len(mutate.sample(mutants, 10_000, 0)) == len(mutants)


def test_real_labs_yield_mutants_in_every_solution_cell():
    for lab in ("04_mixed_precision", "06_profiling"):
        nb = nbformat.read(str(grading.REPO_ROOT / "solutions" / lab / f"{lab}.ipynb"), as_version=4)
        cells = {c.metadata["nbgrader"]["grade_id"] for c in nb.cells
                 if c.get("metadata", {}).get("nbgrader", {}).get("solution")}
        assert {m.grade_id for m in mutate.lab_mutants(nb)} == cells


def test_accepted_mutants_need_a_reason(tmp_path):
    (tmp_path / "grader" / "mutants").mkdir(parents=True)
    path = mutate.accepted_path("00_x", tmp_path)
    path.write_text('[[accepted]]\nid = "abc"\nreason = "same program"\n')
    assert mutate.load_accepted("00_x", tmp_path) == {"abc": "same program"}
    path.write_text('[[accepted]]\nid = "abc"\n')
    with pytest.raises(ValueError, match="reason"):
        mutate.load_accepted("00_x", tmp_path)
    assert mutate.load_accepted("00_missing", tmp_path) == {}


def test_cli_has_a_mutate_command():
    args = cli.build_parser().parse_args(["mutate", "04_mixed_precision", "--n", "5", "--seed", "1",
                                          "--min-kill", "0.8"])
    assert (args.lab, args.n, args.seed, args.min_kill, args.func) == ("04_mixed_precision", 5, 1, 0.8, cli._mutate)


# ------------------------------------------------------------------------------------------ real runs
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_swap_session_stops_a_cell_at_the_courses_cell_limit(synthetic_course, tmp_path, no_leaked_processes):
    """``dtlabs mutate`` (a swap session) gives a cell the limit grading gives it, ``c.DTLabs.cell_timeout`` from the
    course's config: a mutant that hangs is stopped there, and counted as timed out."""
    from lab_utils.grading.quality.swaps import Swap, check_swaps

    root = tmp_path / "course"
    shutil.copytree(synthetic_course / "solutions", root / "solutions")
    (root / "grader").mkdir()
    (root / "grader" / "nbgrader_config.py").write_text("c = get_config()  # noqa\nc.DTLabs.cell_timeout = 4\n")
    hangs = "def add(a, b):\n    import time\n    time.sleep(600)\n\n\ndef twice(x):\n    return 2 * x\n"
    start = time.monotonic()
    report = check_swaps(SYNTHETIC_LAB, [Swap("hangs", {"add": hangs})], root=root)
    took = time.monotonic() - start
    assert report.results["hangs"].timed_out == ["test_add"], report.results["hangs"]
    assert report.results["hangs"].scores["test_add"][0] == 0
    assert took < 60, f"the session took {took:.0f} s: the course's 4 s limit was not the cell's"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_mutate_grades_the_synthetic_lab_and_fails_below_min_kill(synthetic_course, tmp_path, no_leaked_processes):
    root = tmp_path / "course"
    shutil.copytree(synthetic_course / "solutions", root / "solutions")
    out = io.StringIO()
    assert mutate.main(SYNTHETIC_LAB, n=None, seed=0, min_kill=0.9, root=root, stream=out) is Status.DONE, out.getvalue()
    text = out.getvalue()
    assert "kill rate 00_synthetic: 6/6 = 100%" in text, text
    assert "SURVIVED" not in text

    # weaken test_twice: now the off-by-one constants of twice() survive, the kill rate drops, the exit code is 1
    path = root / "solutions" / SYNTHETIC_LAB / f"{SYNTHETIC_LAB}.ipynb"
    nb = nbformat.read(str(path), as_version=4)
    cell = next(c for c in nb.cells if c.get("id") == "test-twice")
    cell.source = "assert twice(3) is not None"
    nbformat.write(nb, str(path))
    out = io.StringIO()
    assert mutate.main(SYNTHETIC_LAB, n=None, seed=0, min_kill=0.9, root=root, stream=out) is Status.INCOMPLETE, out.getvalue()
    text = out.getvalue()
    assert "SURVIVED" in text and "+    return 3 * x" in text and "(required 90%): FAIL" in text, text

    # an accepted mutant is neither graded nor counted
    twice3 = next(m for m in mutate.lab_mutants(nb) if m.description == "2 -> 3")
    (root / "grader" / "mutants").mkdir(parents=True)
    mutate.accepted_path(SYNTHETIC_LAB, root).write_text(f'[[accepted]]\nid = "{twice3.id}"\nreason = "test"\n')
    out = io.StringIO()
    assert mutate.main(SYNTHETIC_LAB, n=None, seed=0, list_only=True, root=root, stream=out) is Status.DONE
    assert twice3.id not in out.getvalue() and len(out.getvalue().splitlines()) == 5
