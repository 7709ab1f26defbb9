"""The order pytest-xdist hands out the long tests in."""
from __future__ import annotations

# What the longest groups and tests took in `make test` (seconds, 2 cores, 4 workers; a group's tests summed).
# pytest-xdist's loadgroup hands out work in collection order, so the longest go first (longest-processing-time-first)
# and no worker starts a five-minute group when the others are nearly done. Only the order changes; an unlisted test
# keeps its place.
EXPECTED_S = {
    "lab-10_3d_frameworks": 191, "gradescope": 161, "cheats-bwrap-00_synthetic": 118, "lab-05_multi_node": 110,
    "cheats-bwrap-01_ddp_setup": 109, "lab-01_ddp_setup": 102, "lab-03_fsdp_zero": 97, "cheats-fallback-": 96,
    "lab-09_async_elastic": 89, "test_solution_runs_under_papermill[05_": 85,
    "test_solution_runs_under_papermill[10_": 83, "lab-07_model_parallel": 77,
    "test_solution_runs_under_papermill[09_": 56, "graded-class": 54, "lab-08_comm_efficiency": 53,
    "test_merge_job_on_a_gradebook": 39, "test_grade_batch_survives_broken_and_hanging": 39, "lab-11_gpu_kernels": 80,
}


def expected_s(item) -> float:
    mark = item.get_closest_marker("xdist_group")
    group = (mark.args[0] if mark and mark.args else mark.kwargs.get("name", "")) if mark else ""
    return max((s for key, s in EXPECTED_S.items() if group.startswith(key) or key in item.nodeid), default=0)
