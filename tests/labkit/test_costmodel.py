"""The all-reduce cost model (lab_utils.labkit.costmodel) and the explorer widget built on it (Lab 06)."""
from __future__ import annotations

import math

import pytest

from lab_utils.labkit import costmodel

ALPHA, BETA = 10e-6, 1e-9  # 10 µs, 1 GB/s


@pytest.mark.parametrize("p", [1, 2, 3, 4, 8, 64])
def test_ring_allreduce_matches_two_p_minus_one_messages_of_n_over_p(p):
    n = 8e6
    expected = 2 * (p - 1) * ALPHA + 2 * (p - 1) / p * n * BETA
    assert costmodel.ring_allreduce_time(n, p, ALPHA, BETA) == pytest.approx(expected)


@pytest.mark.parametrize("p, rounds", [(1, 0), (2, 1), (3, 2), (4, 2), (5, 3), (8, 3), (9, 4), (1024, 10)])
def test_tree_allreduce_pays_two_ceil_log2_p_whole_messages(p, rounds):
    n = 1e6
    assert costmodel.tree_allreduce_time(n, p, ALPHA, BETA) == pytest.approx(2 * rounds * (ALPHA + n * BETA))


def test_both_formulas_take_bytes_first_then_ranks_as_lab_05_does():
    # (n_bytes, world_size, alpha, beta): the order of Lab 05's student contract; the tree rounds log2 p up
    assert costmodel.ring_allreduce_time(n_bytes=1e6, world_size=4, alpha=1e-5, beta=1e-9) == pytest.approx(
        2 * 3 * 1e-5 + 2 * 3 / 4 * 1e6 * 1e-9)
    assert costmodel.tree_allreduce_time(1e6, 6, 3e-6, 2e-10) == pytest.approx(2 * 3 * (3e-6 + 1e6 * 2e-10))


def test_one_rank_costs_nothing():
    assert costmodel.ring_allreduce_time(1e9, 1, ALPHA, BETA) == 0.0
    assert costmodel.tree_allreduce_time(1e9, 1, ALPHA, BETA) == 0.0


def test_ring_bandwidth_term_approaches_two_n_beta_and_tree_grows_with_log_p():
    n = 1e9
    assert costmodel.ring_allreduce_time(n, 4096, 0.0, BETA) == pytest.approx(2 * n * BETA, rel=1e-3)
    assert costmodel.tree_allreduce_time(n, 4096, 0.0, BETA) == pytest.approx(24 * n * BETA)


@pytest.mark.parametrize("p", [4, 8, 16, 64, 512])
def test_crossover_is_where_ring_and_tree_cost_the_same(p):
    n_star = costmodel.tree_beats_ring_below(p, ALPHA, BETA)
    assert n_star > 0
    ring, tree = costmodel.ring_allreduce_time(n_star, p, ALPHA, BETA), costmodel.tree_allreduce_time(n_star, p, ALPHA, BETA)
    assert ring == pytest.approx(tree)
    assert costmodel.tree_allreduce_time(n_star / 2, p, ALPHA, BETA) < costmodel.ring_allreduce_time(n_star / 2, p, ALPHA, BETA)
    assert costmodel.tree_allreduce_time(n_star * 2, p, ALPHA, BETA) > costmodel.ring_allreduce_time(n_star * 2, p, ALPHA, BETA)


@pytest.mark.parametrize("p", [1, 2, 3])
def test_ring_never_loses_at_small_world_sizes(p):
    assert costmodel.tree_beats_ring_below(p, ALPHA, BETA) == 0.0


def test_free_bandwidth_makes_the_tree_win_every_size():
    assert costmodel.tree_beats_ring_below(8, ALPHA, 0.0) == math.inf


@pytest.mark.parametrize("bad", [dict(world_size=0), dict(world_size=2.5), dict(n_bytes=-1), dict(alpha=-1e-6)])
def test_nonsense_inputs_are_refused(bad):
    args = dict(world_size=4, n_bytes=1e6, alpha=ALPHA, beta=BETA) | bad
    with pytest.raises(ValueError):
        costmodel.ring_allreduce_time(**args)


def test_ddp_step_hides_overlapped_communication_only_behind_compute():
    assert costmodel.ddp_step_time(0.1, 0.04, overlap=0.0) == pytest.approx(0.14)
    assert costmodel.ddp_step_time(0.1, 0.04, overlap=1.0) == pytest.approx(0.1)
    assert costmodel.ddp_step_time(0.1, 0.04, overlap=0.5) == pytest.approx(0.12)
    assert costmodel.ddp_step_time(0.01, 0.04, overlap=1.0) == pytest.approx(0.04)  # only 10 ms can hide
    with pytest.raises(ValueError):
        costmodel.ddp_step_time(0.1, 0.04, overlap=1.5)


def test_comm_share_counts_in_flight_time_once_and_exposed_time_separately():
    share = costmodel.comm_share(0.1, 0.04, overlap=0.5)
    assert share["step_s"] == pytest.approx(0.12)
    assert share["in_flight"] == pytest.approx(0.04 / 0.12)
    assert share["exposed"] == pytest.approx(0.02 / 0.12)
    assert costmodel.comm_share(0.0, 0.0) == {"step_s": 0.0, "in_flight": 0.0, "exposed": 0.0}


def test_explorer_renders_a_png_and_its_numbers_headlessly():
    pytest.importorskip("matplotlib")
    from lab_utils.labkit.widgets import render_allreduce

    png, s = render_allreduce(world_size=512, message_mb=0.01, bandwidth_gbs=10, latency_us=20, compute_ms=100)
    assert png.startswith(b"\x89PNG")
    assert s["winner"] == "tree" and s["tree_s"] < s["ring_s"]
    assert s["ring_s"] == pytest.approx(costmodel.ring_allreduce_time(1e4, 512, 20e-6, 1e-10))


def test_explorer_widget_builds_headlessly_and_follows_its_sliders():
    pytest.importorskip("ipywidgets")
    from lab_utils.labkit.widgets import allreduce_explorer

    box = allreduce_explorer(world_size=2, message_mb=100.0)
    assert set(box.controls) == {"world_size", "message_mb", "bandwidth_gbs", "latency_us", "compute_ms", "overlap"}
    assert box.numbers["winner"] == "ring" and "p = 2" in box.summary.value
    box.controls["message_mb"].value = 0.001
    box.controls["world_size"].value = 512
    assert box.numbers["world_size"] == 512 and box.numbers["winner"] == "tree"
    assert "<b>tree</b> wins" in box.summary.value
    assert bytes(box.image.value).startswith(b"\x89PNG")
