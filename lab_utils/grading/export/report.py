"""``dtlabs report LAB``: what the class got wrong, as one self-contained HTML page for the instructor.

Built only from what every grading path leaves in the course (local ``dtlabs grade``, a Slurm array's ``dtlabs
merge``): nbgrader's gradebook (scores per test cell, late penalties), the autograded notebooks (each failing
cell's message), and the grading record (``outcomes``: submissions NOT GRADED and why, seconds per submission).
The page holds the score distribution, how many submissions failed each test cell, the most common first failing
messages with their counts, the submissions that were NOT GRADED with the reason, and the grading seconds per
submission; the plots are matplotlib PNGs embedded as data URIs, so the page is one file that opens anywhere.

The page may be shared with TAs: it never holds hidden test source (messages are redacted against the lab's
hidden lines, as in feedback; a failing hidden check's message is shown, as students see it in their feedback).
It names students only where the instructor must act (NOT GRADED, the slowest submissions); ``--anonymous``
numbers them instead.
"""
from __future__ import annotations

import base64
import html
import io
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from lab_utils.grading.course import WORK, find_course_root, submissions
from lab_utils.grading import outcomes
from lab_utils.grading.export import cells


@dataclass
class Graded:
    """One graded submission, as the gradebook and its autograded notebook say."""

    student: str
    score: float
    penalty: float
    cells: dict  # grade_id -> (score, max_score)
    first_failure: str | None  # "grade_id: Name: message" of the first failing cell, redacted


@dataclass
class ClassResults:
    lab: str
    max_score: float
    tests: list  # cells.GradedCell
    graded: list = field(default_factory=list)  # Graded
    not_graded: list = field(default_factory=list)  # (student, reason)
    seconds: dict = field(default_factory=dict)  # student -> seconds of its latest grading run


def gather(course_root: Path | str, lab: str) -> ClassResults:
    """Everything the page shows, read from the course (module docstring)."""
    from nbgrader.api import Gradebook, MissingEntry

    from lab_utils.grading import gradebook

    course_root = Path(course_root)
    source = cells.source_notebook(course_root, lab)
    hidden = cells.lab_hidden_lines(source)
    tests = cells.graded_cells(source)
    record = outcomes.of_lab(course_root, lab)
    out = ClassResults(lab, sum(t.points for t in tests), tests)
    graded_ids = set()
    if (course_root / WORK / "gradebook.db").is_file():
        with Gradebook(gradebook.db_url(course_root)) as gb:
            try:
                assignment = gb.find_assignment(lab)
            except MissingEntry:
                assignment = None
            if assignment is not None:
                out.max_score = float(assignment.max_score)
                for sub in assignment.submissions:
                    run = record.get(sub.student_id)
                    if run and not run.get("graded"):
                        continue  # its latest run was NOT GRADED: listed below, not counted with an older score
                    scores = {g.name: (float(g.score or 0.0), float(g.max_score)) for nb in sub.notebooks
                              for g in nb.grades}
                    out.graded.append(Graded(sub.student_id, float(sub.score or 0.0),
                                             float(sub.late_submission_penalty or 0.0), scores,
                                             _first_failure(course_root, lab, sub.student_id, tests, scores, hidden)))
                    graded_ids.add(sub.student_id)
    for student, run in sorted(record.items()):
        if not run.get("graded"):
            reason = "; ".join(cells.clean(r, hidden, 300) for r in run.get("reasons") or []) or "no reason recorded"
            out.not_graded.append((student, reason))
        if run.get("seconds") is not None:
            out.seconds[student] = float(run["seconds"])
    listed = graded_ids | {s for s, _ in out.not_graded}
    for student in submissions(course_root).get(lab, []):
        if student not in listed:
            out.not_graded.append((student, "submitted, but not graded yet (run dtlabs grade)"))
    out.graded.sort(key=lambda g: g.student)
    return out


def _first_failure(course_root: Path, lab: str, student: str, tests, scores: dict, hidden) -> str | None:
    """The first test cell (notebook order) that lost points, with the message its run ended in."""
    failing = [t.grade_id for t in tests if scores.get(t.grade_id, (0.0, t.points))[0] < scores.get(
        t.grade_id, (0.0, t.points))[1]]
    if not failing:
        return None
    path = course_root / WORK / "autograded" / student / lab / f"{lab}.ipynb"
    try:
        said = cells.messages(cells.read(path), hidden)
    except Exception:  # noqa: BLE001 - a missing or unreadable notebook: the cell is still named
        said = {}
    return f"{failing[0]}: {cells.first_line(said.get(failing[0], cells.NO_MESSAGE))}"


# ------------------------------------------------------------------------------------------ the page
def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _figure(width=6.4, height=3.2):
    from matplotlib.figure import Figure  # no pyplot: no global state, no display needed

    fig = Figure(figsize=(width, height))
    return fig, fig.add_subplot()


def _integer_ticks(*axes) -> None:
    from matplotlib.ticker import MaxNLocator

    for axis in axes:
        axis.set_major_locator(MaxNLocator(integer=True))


def score_plot(res: ClassResults) -> str:
    fig, ax = _figure()
    totals = [g.score - g.penalty for g in res.graded]
    top = max(res.max_score, max(totals, default=0.0), 1.0)
    bins = [i - 0.5 for i in range(int(top) + 2)] if top <= 40 else 20
    ax.hist(totals, bins=bins, color="#4c72b0", edgecolor="white")
    _integer_ticks(ax.xaxis, ax.yaxis)
    ax.set_xlabel(f"score (of {res.max_score:g}; after late penalties)")
    ax.set_ylabel("submissions")
    ax.set_title(f"{res.lab}: score distribution ({len(totals)} graded)")
    return _png(fig)


def failures_plot(res: ClassResults, failed: dict) -> str:
    fig, ax = _figure(6.4, max(1.8, 0.45 * len(res.tests) + 1.0))
    names = [t.grade_id for t in res.tests][::-1]
    counts = [failed[t.grade_id] for t in res.tests][::-1]
    passed = [len(res.graded) - c for c in counts]
    ax.barh(names, counts, color="#c44e52", label="failed")
    ax.barh(names, passed, left=counts, color="#dddddd", label="passed")
    _integer_ticks(ax.xaxis)
    ax.set_xlabel("submissions")
    ax.set_title("failed, per test cell")
    ax.legend(loc="lower right", fontsize="small")
    return _png(fig)


def seconds_plot(res: ClassResults) -> str:
    fig, ax = _figure()
    secs = sorted(res.seconds.values(), reverse=True)
    ax.bar(range(1, len(secs) + 1), secs, color="#55a868")
    _integer_ticks(ax.xaxis)
    ax.set_xlabel("submissions, slowest first")
    ax.set_ylabel("seconds to grade")
    ax.set_title("grading time per submission")
    return _png(fig)


CSS = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:60em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left;
vertical-align:top}th{background:#f3f3f3}td.n{text-align:right}img{display:block;margin:.5em 0 1.5em}
.muted{color:#777}code{font-size:.95em}"""


def _table(head, rows, numeric=()) -> str:
    cells_ = "".join(f"<th>{html.escape(str(h))}</th>" for h in head)
    body = "".join("<tr>" + "".join(
        f"<td{' class=n' if i in numeric else ''}>{html.escape(str(v))}</td>" for i, v in enumerate(r)) + "</tr>"
        for r in rows)
    return f"<table><tr>{cells_}</tr>{body}</table>"


def render(res: ClassResults, *, anonymous: bool = False, top: int = 15) -> str:
    """The page's HTML."""
    names = {s: f"submission {i}" for i, s in enumerate(sorted(
        {g.student for g in res.graded} | {s for s, _ in res.not_graded} | set(res.seconds)), start=1)}
    who = (lambda s: names[s]) if anonymous else (lambda s: s)
    e = html.escape
    failed = {t.grade_id: sum(1 for g in res.graded if g.cells.get(t.grade_id, (0.0, t.points))[0] <
                              g.cells.get(t.grade_id, (0.0, t.points))[1]) for t in res.tests}
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{e(res.lab)}: what the class got wrong</title>"
             f"<style>{CSS}</style></head><body>", f"<h1>{e(res.lab)}: what the class got wrong</h1>"]
    totals = [g.score - g.penalty for g in res.graded]
    summary = (f"{len(res.graded)} graded, {len(res.not_graded)} not graded; " + (
        f"median score {statistics.median(totals):g} of {res.max_score:g}, "
        f"{sum(1 for t in totals if t >= res.max_score)} full marks, {sum(1 for t in totals if t == 0)} zero"
        if totals else "no graded submission yet"))
    parts.append(f"<p>{e(summary)}. Hidden test source never appears here; messages are as students see them in "
                 "their feedback.</p>")

    parts.append("<section id='scores'><h2>Score distribution</h2>")
    if totals:
        parts.append(f"<img id='plot-scores' alt='score distribution' src='{score_plot(res)}'>")
        late = [g for g in res.graded if g.penalty]
        if late:
            parts.append(f"<p>{len(late)} submission(s) lost points to the late-submission penalty.</p>")
    else:
        parts.append("<p class=muted>No graded submission yet.</p>")

    parts.append("</section>")
    parts.append("<section id='tests'><h2>Failed, per test cell</h2>")
    if res.graded:
        parts.append(f"<img id='plot-tests' alt='failures per test cell' src='{failures_plot(res, failed)}'>")
    parts.append(_table(["test cell", "points", "hidden tests", "failed", "of graded"],
                        [(t.name, f"{t.points:g}", "yes" if t.hidden else "no", failed[t.grade_id], len(res.graded))
                         for t in res.tests], numeric=(1, 3, 4)))

    parts.append("</section>")
    parts.append("<section id='messages'><h2>Most common first failure</h2>")
    firsts = Counter(g.first_failure for g in res.graded if g.first_failure)
    if firsts:
        parts.append("<p>The first test cell (in notebook order) each submission failed, and the message it "
                     "failed with.</p>")
        parts.append(_table(["submissions", "test cell: message"],
                            [(count, message) for message, count in firsts.most_common(top)], numeric=(0,)))
    else:
        parts.append("<p class=muted>No graded submission failed a test.</p>")

    parts.append("</section>")
    parts.append("<section id='not-graded'><h2>NOT GRADED</h2>")
    if res.not_graded:
        parts.append(_table(["submission", "why"], [(who(s), why) for s, why in res.not_graded]))
    else:
        parts.append("<p class=muted>Every submission was graded.</p>")

    parts.append("</section>")
    parts.append("<section id='seconds'><h2>Grading time</h2>")
    if res.seconds:
        secs = sorted(res.seconds.items(), key=lambda kv: -kv[1])
        values = [v for _, v in secs]
        parts.append(f"<p>{len(values)} submission(s): median {statistics.median(values):.1f} s, "
                     f"slowest {values[0]:.1f} s, total {sum(values):.0f} s.</p>")
        parts.append(f"<img id='plot-seconds' alt='grading seconds per submission' src='{seconds_plot(res)}'>")
        parts.append(_table(["slowest", "seconds"], [(who(s), f"{v:.1f}") for s, v in secs[:5]], numeric=(1,)))
    else:
        parts.append("<p class=muted>No grading time recorded (dtlabs grade and dtlabs merge record it).</p>")
    parts.append("</section></body></html>")
    return "\n".join(parts)


def write(lab: str, out: Path | str | None = None, *, course_root=None, anonymous: bool = False) -> Path:
    """Gather, render and write the page; returns its path (default ``grader/work/reports/<lab>.html``)."""
    from lab_utils.grading.course import GradingError, discover_labs

    course_root = find_course_root(course_root)
    if lab not in discover_labs(course_root):
        raise GradingError(f"no lab {lab!r} in {course_root}/solutions (labs: {discover_labs(course_root)})")
    path = Path(out) if out else course_root / WORK / "reports" / f"{lab}.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(gather(course_root, lab), anonymous=anonymous), encoding="utf-8")
    return path.resolve()
