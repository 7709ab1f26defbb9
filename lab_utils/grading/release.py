"""``labs/`` from ``solutions/``: nbgrader's ``generate_assignment``, and what makes a committed notebook reproducible."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from lab_utils.grading import gradebook
from lab_utils.grading.course import GradingError, discover_labs, find_course_root
from lab_utils.grading.nbgrader_run import run_nbgrader


def release(labs=None, *, root: Path | str | None = None, dest: Path | str | None = None, echo=False) -> list[Path]:
    """Regenerate the release (``labs/`` by default, or ``dest``) of ``labs`` (default: all) from solutions/.

    This is ``nbgrader generate_assignment --force``; with ``dest`` it also passes ``--no-db`` so a trial
    release touches no gradebook. nbgrader writes no timestamps (two runs give the same bytes); we only make
    sure of a trailing newline. Returns the notebooks written.
    """
    root = find_course_root(root)
    known = discover_labs(root)
    labs = list(labs) if labs else known
    missing = [lab for lab in labs if lab not in known]
    if missing:
        raise GradingError(f"no solutions/NN_topic/NN_topic.ipynb for {missing}; labs found: {known}")
    out_root = Path(dest).resolve() if dest else root / "labs"
    extra = ["--no-db", f"--CourseDirectory.release_directory={out_root}"] if dest else []
    # one nbgrader process for all labs when it can (start-up costs seconds); nbgrader globs assignment ids
    globbed = {d.name for d in (root / "solutions").glob("[0-9][0-9]_*") if d.is_dir()}
    every = globbed == set(labs)
    batches = [("[0-9][0-9]_*", labs)] if every and len(labs) > 1 else [(lab, [lab]) for lab in labs]
    written = []
    for pattern, group in batches:
        for lab in group:  # --force replaces a lab's folder; make sure no stale file survives either way
            shutil.rmtree(out_root / lab, ignore_errors=True)
        run = run_nbgrader(["generate_assignment", pattern, "--force", *extra], course_root=root, timeout=600,
                           echo=echo)
        for lab in group:
            nb_path = out_root / lab / f"{lab}.ipynb"
            if run.returncode != 0 or not nb_path.is_file():
                raise GradingError(f"nbgrader generate_assignment {pattern} failed:\n{run.output[-4000:]}")
            data = nb_path.read_bytes()
            if not data.endswith(b"\n"):
                nb_path.write_bytes(data + b"\n")
            written.append(nb_path)
        if not dest:  # the course's gradebook now holds these labs as their source is
            gradebook.note_recorded(root, group)
    return written


def notebook_problems(path) -> list[str]:
    """Problems that keep a committed notebook from being reproducible: outputs, execution counts/metadata."""
    nb = json.loads(Path(path).read_text())
    problems = []
    for i, cell in enumerate(nb.get("cells", [])):
        where = f"cell {i} ({cell.get('id', '?')})"
        if cell.get("outputs"):
            problems.append(f"{where} has outputs")
        if cell.get("execution_count") is not None:
            problems.append(f"{where} has an execution count")
        meta = cell.get("metadata", {})
        for key in ("execution", "papermill", "ExecuteTime"):
            if key in meta:
                problems.append(f"{where} has metadata '{key}'")
        if "id" not in cell:
            problems.append(f"{where} has no id")
    for key in ("papermill", "widgets"):
        if key in nb.get("metadata", {}):
            problems.append(f"notebook metadata has '{key}'")
    return problems
