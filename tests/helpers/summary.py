"""Each lab's timings and points, noted on a test's report (so xdist workers' results reach the controller) and
printed at the end of the run."""
from __future__ import annotations

LAB_TIMINGS: dict = {}  # lab -> {"papermill_s": ..., "autograde_s": ...}
LAB_POINTS: dict = {}  # lab -> {student: "earned/possible"} from autograde


def record_lab(node, lab: str, timings: dict | None = None, points: dict | None = None) -> None:
    """Note a lab's timings/points on the test's report, so the summary has them with or without xdist workers."""
    if timings:
        node.user_properties.append(("lab_timings", (lab, dict(timings))))
    if points:
        node.user_properties.append(("lab_points", (lab, dict(points))))


def collect(report) -> None:
    """Gather what ``record_lab`` noted on a test's report."""
    for name, value in getattr(report, "user_properties", ()):
        if name == "lab_timings":
            LAB_TIMINGS.setdefault(value[0], {}).update(value[1])
        elif name == "lab_points":
            LAB_POINTS.setdefault(value[0], {}).update(value[1])


def write(terminalreporter) -> None:
    if LAB_TIMINGS:
        terminalreporter.section("lab timings (seconds)")
        for lab, t in sorted(LAB_TIMINGS.items()):
            parts = ", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in sorted(t.items()))
            terminalreporter.write_line(f"{lab}: {parts}")
    if LAB_POINTS:
        terminalreporter.section("lab points (autograde; known-wrong: on the cells each must lose)")
        for lab, students in sorted(LAB_POINTS.items()):
            terminalreporter.write_line(f"{lab}:")
            for student, points in students.items():
                terminalreporter.write_line(f"    {student}: {points}")
