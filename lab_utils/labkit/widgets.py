"""Interactive explorers for the notebooks (ipywidgets); they also build headlessly, for tests and papermill.

    from lab_utils.labkit.widgets import allreduce_explorer
    allreduce_explorer()          # the last expression of a cell shows it

Move a slider and the figure is redrawn: ring vs tree all-reduce time (``lab_utils.labkit.costmodel``) against the
world size and the message size, and what the winner does to a DDP step's communication share.
The figure is drawn off-screen (Agg, no pyplot state) into an ``ipywidgets.Image``: a slider change only sets
the image's bytes, with no ``display()`` into an ``Output`` widget, so nothing depends on the matplotlib backend
or on the kernel's output capture (an executed notebook, headless tests and a browser all see the same thing).
"""
from __future__ import annotations

import io

from lab_utils.labkit import costmodel

__all__ = ["allreduce_explorer", "render_allreduce"]

MB = 1e6  # the explorer speaks decimal units: 1 MB = 10^6 bytes, 1 GB/s = 10^9 bytes/s
RING, TREE = "#1f77b4", "#ff7f0e"


def _times(p, n_bytes, alpha, beta):
    return (costmodel.ring_allreduce_time(n_bytes, p, alpha, beta),
            costmodel.tree_allreduce_time(n_bytes, p, alpha, beta))


def render_allreduce(world_size=16, message_mb=100.0, bandwidth_gbs=10.0, latency_us=20.0, compute_ms=100.0,
                     overlap=0.5):
    """Draw the explorer's figure for one set of slider values.

    Returns ``(png_bytes, summary)``: the picture, and a dict of the numbers it shows (times in seconds).
    """
    from matplotlib.figure import Figure

    p = int(world_size)
    n = message_mb * MB
    alpha, beta = latency_us * 1e-6, 1.0 / (bandwidth_gbs * 1e9)
    ring, tree = _times(p, n, alpha, beta)
    comm = min(ring, tree)
    share = costmodel.comm_share(compute_ms * 1e-3, comm, overlap)
    summary = {
        "world_size": p, "ring_s": ring, "tree_s": tree, "winner": "ring" if ring <= tree else "tree",
        "crossover_bytes": costmodel.tree_beats_ring_below(p, alpha, beta), **share,
    }

    fig = Figure(figsize=(11.5, 3.4), layout="constrained")
    ax_p, ax_n, ax_step = fig.subplots(1, 3, width_ratios=[1.2, 1.2, 1.0])

    ps = sorted({2 ** k for k in range(1, 11)} | {p})
    ax_p.plot(ps, [_times(q, n, alpha, beta)[0] * 1e3 for q in ps], "-o", ms=3, color=RING, label="ring")
    ax_p.plot(ps, [_times(q, n, alpha, beta)[1] * 1e3 for q in ps], "-o", ms=3, color=TREE, label="tree")
    ax_p.axvline(p, color="0.5", lw=0.8, ls="--")
    ax_p.set(xscale="log", yscale="log", xlabel="world size p", ylabel="all-reduce time (ms)",
             title=f"message {message_mb:.3g} MB")
    ax_p.set_xticks([2, 8, 32, 128, 512], labels=["2", "8", "32", "128", "512"])
    ax_p.legend(loc="upper left", fontsize=8)

    sizes = [10 ** (k / 4) for k in range(0, 41)]  # 1 B .. 10 GB
    ax_n.plot(sizes, [_times(p, s, alpha, beta)[0] * 1e3 for s in sizes], color=RING, label="ring")
    ax_n.plot(sizes, [_times(p, s, alpha, beta)[1] * 1e3 for s in sizes], color=TREE, label="tree")
    ax_n.axvline(n, color="0.5", lw=0.8, ls="--")
    if 0 < summary["crossover_bytes"] < float("inf"):
        ax_n.axvline(summary["crossover_bytes"], color="k", lw=0.8, ls=":", label="tree wins below")
    ax_n.set(xscale="log", yscale="log", xlabel="message size (bytes)", ylabel="all-reduce time (ms)",
             title=f"p = {p}")
    ax_n.legend(loc="upper left", fontsize=8)

    compute_s = compute_ms * 1e-3
    hidden = compute_s + comm - share["step_s"]
    ax_step.barh([0], [compute_s * 1e3], color="0.7", label="compute")
    ax_step.barh([0], [hidden * 1e3], left=[(compute_s - hidden) * 1e3], color="#2ca02c", alpha=0.8,
                 label="comm hidden by overlap")
    ax_step.barh([0], [(comm - hidden) * 1e3], left=[compute_s * 1e3], color="#d62728",
                 label="comm exposed")
    ax_step.set(yticks=[], xlabel="time in one step (ms)",
                title=f"DDP step: comm in flight {share['in_flight']:.0%}\nexposed (waiting) {share['exposed']:.0%}")
    ax_step.set_ylim(-0.6, 2.4)
    ax_step.legend(loc="upper left", fontsize=8)

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    return buf.getvalue(), summary


def _summary_html(s):
    cross = s["crossover_bytes"]
    if cross == 0:
        cross_txt = f"the ring is never slower at p = {s['world_size']}"
    elif cross == float("inf"):
        cross_txt = "the tree always wins (bandwidth is free)"
    else:
        cross_txt = f"the tree wins below {cross:,.0f} bytes"
    return (
        f"<b>p = {s['world_size']}</b>: ring {s['ring_s'] * 1e3:.3g} ms, tree {s['tree_s'] * 1e3:.3g} ms, "
        f"<b>{s['winner']}</b> wins ({cross_txt}). DDP step {s['step_s'] * 1e3:.3g} ms: communication in flight "
        f"{s['in_flight']:.0%} of the step, exposed {s['exposed']:.0%}."
    )


def _world_sizes(extra: int) -> list[int]:
    """2, 3, 4, 6, 8, 12, ... 1024 (powers of two and the midpoints between them), plus ``extra``."""
    sizes = {2 ** k for k in range(1, 11)} | {3 * 2 ** k for k in range(0, 9)} | {int(extra)}
    return sorted(sizes)


def allreduce_explorer(world_size=16, message_mb=100.0, bandwidth_gbs=10.0, latency_us=20.0, compute_ms=100.0,
                       overlap=0.5):
    """Sliders for the alpha-beta model of all-reduce and a DDP step; returns an ``ipywidgets.VBox``.

    The box carries ``.controls`` (name -> slider), ``.summary`` (an ``HTML`` line with the numbers),
    ``.image`` (the figure, an ``Image`` widget) and ``.numbers`` (a dict of what the figure shows now).
    """
    import ipywidgets as widgets

    style = {"description_width": "150px"}
    layout = widgets.Layout(width="430px")
    controls = {
        # world sizes on a log scale: a linear 2..1024 slider crowds 2..64, where most labs live, into its first 6%
        "world_size": widgets.SelectionSlider(options=_world_sizes(world_size), value=int(world_size),
                                              description="world size p", continuous_update=False,
                                              style=style, layout=layout),
        "message_mb": widgets.FloatLogSlider(message_mb, base=10, min=-3, max=4, step=0.1,
                                             description="gradients (MB)", readout_format=".3g",
                                             continuous_update=False, style=style, layout=layout),
        "bandwidth_gbs": widgets.FloatLogSlider(bandwidth_gbs, base=10, min=-1, max=3, step=0.1,
                                                description="bandwidth (GB/s)", readout_format=".3g",
                                                continuous_update=False, style=style, layout=layout),
        "latency_us": widgets.FloatLogSlider(latency_us, base=10, min=0, max=3, step=0.1,
                                             description="latency alpha (µs)", readout_format=".3g",
                                             continuous_update=False, style=style, layout=layout),
        "compute_ms": widgets.FloatLogSlider(compute_ms, base=10, min=0, max=4, step=0.1,
                                             description="compute / step (ms)", readout_format=".3g",
                                             continuous_update=False, style=style, layout=layout),
        "overlap": widgets.FloatSlider(overlap, min=0.0, max=1.0, step=0.05, description="overlap",
                                       continuous_update=False, style=style, layout=layout),
    }
    summary = widgets.HTML()
    image = widgets.Image(format="png", layout=widgets.Layout(width="100%", max_width="1100px"))
    numbers = {}

    def update(change=None):
        png, s = render_allreduce(**{name: w.value for name, w in controls.items()})
        numbers.clear()
        numbers.update(s)
        summary.value = _summary_html(s)
        image.value = png

    for w in controls.values():
        w.observe(update, names="value")
    update()
    names = list(controls)
    sliders = widgets.HBox([widgets.VBox([controls[k] for k in names[:3]]),
                            widgets.VBox([controls[k] for k in names[3:]])])
    box = widgets.VBox([sliders, summary, image])
    box.add_class("dtlabs-allreduce-explorer")
    box.controls, box.summary, box.image, box.numbers = controls, summary, image, numbers
    return box
