"""What an all-reduce and a DDP step should cost, on paper: the alpha-beta (latency-bandwidth) model.

Sending ``n`` bytes from one process to another takes ``alpha + n * beta`` seconds: ``alpha`` is the
per-message latency, ``beta`` the seconds per byte (1 / bandwidth). This is Hockney's model (Parallel
Computing 20, 1994), the one Thakur, Rabenseifner & Gropp use to choose MPICH's collective algorithms
("Optimization of Collective Communication Operations in MPICH", IJHPCA 19(1), 2005). The reduction
arithmetic (their ``gamma`` term) is left out: next to the network it is small.

All functions are pure: seconds, bytes and seconds-per-byte in, seconds (or a fraction) out. The two
all-reduce formulas take ``(n_bytes, world_size, alpha, beta)``, the order Lab 05's exercise uses, and the tree
counts ``ceil(log2 p)`` rounds (a binomial tree cannot run a fraction of a round), as Lab 05 and Lab 06 teach.
"""
from __future__ import annotations

import math

__all__ = [
    "ring_allreduce_time",
    "tree_allreduce_time",
    "tree_beats_ring_below",
    "ddp_step_time",
    "comm_share",
]


def _check(n_bytes, world_size, alpha, beta):
    if isinstance(world_size, bool) or int(world_size) != world_size or world_size < 1:
        raise ValueError(f"world_size must be a whole number >= 1, got {world_size!r}")
    for name, value in (("n_bytes", n_bytes), ("alpha", alpha), ("beta", beta)):
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value!r}")
    return int(world_size)


def ring_allreduce_time(n_bytes: float, world_size: int, alpha: float, beta: float) -> float:
    """Ring all-reduce: ``2(p-1) alpha + 2(p-1)/p * n * beta``.

    A reduce-scatter then an all-gather, each ``p-1`` steps in which every rank sends one ``n/p`` chunk to
    its neighbour (Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for clusters of workstations",
    JPDC 69(2), 2009). The bandwidth term tends to ``2 n beta`` however many ranks there are, which is why
    NCCL and gloo use rings for large gradients; the latency term grows linearly with ``p``.
    """
    p = _check(n_bytes, world_size, alpha, beta)
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * n_bytes * beta


def tree_allreduce_time(n_bytes: float, world_size: int, alpha: float, beta: float) -> float:
    """Tree all-reduce (reduce to a root, then broadcast back): ``2 ceil(log2 p) (alpha + n * beta)``.

    Each phase takes ``ceil(log2 p)`` rounds of a binomial tree and every round moves the whole message
    (Thakur, Rabenseifner & Gropp 2005, section 4). Few messages, so it wins on small messages and many
    ranks; but the full message crosses the network ``2 ceil(log2 p)`` times, so rings win on big gradients.
    (Pipelined trees, e.g. NCCL's double binary trees, cut the bandwidth term; this is the plain version.)
    """
    p = _check(n_bytes, world_size, alpha, beta)
    rounds = math.ceil(math.log2(p)) if p > 1 else 0
    return 2 * rounds * (alpha + n_bytes * beta)


def tree_beats_ring_below(world_size: int, alpha: float, beta: float) -> float:
    """Message size (bytes) below which the tree is faster than the ring; 0.0 if the ring always wins.

    Setting the two formulas equal: ``n* = alpha (p - 1 - L) / (beta (L - (p - 1)/p))`` with
    ``L = ceil(log2 p)``. For ``p = 2`` both send one message each way and the ring never loses.
    """
    p = _check(0, world_size, alpha, beta)
    rounds = math.ceil(math.log2(p)) if p > 1 else 0
    extra_latency = (p - 1) - rounds  # how many more alpha's the ring pays (per phase)
    extra_bandwidth = rounds - (p - 1) / p  # how many more n*beta's the tree pays (per phase)
    if extra_latency <= 0:
        return 0.0
    if beta == 0:
        return math.inf  # bandwidth is free: only message counts matter, and the tree sends fewer
    return alpha * extra_latency / (beta * extra_bandwidth)


def ddp_step_time(compute_s: float, comm_s: float, overlap: float = 0.0) -> float:
    """Step time of data-parallel training: compute plus the communication that is *not* hidden.

    ``overlap`` is the fraction of the communication that runs while compute still goes on (DDP starts a
    bucket's all-reduce as soon as its gradients are ready, during backward). Communication can hide only
    behind compute, so at most ``compute_s`` of it is hidden.
    """
    if compute_s < 0 or comm_s < 0 or not 0.0 <= overlap <= 1.0:
        raise ValueError(f"need compute_s >= 0, comm_s >= 0, 0 <= overlap <= 1; got {compute_s}, {comm_s}, {overlap}")
    hidden = min(overlap * comm_s, compute_s)
    return compute_s + comm_s - hidden


def comm_share(compute_s: float, comm_s: float, overlap: float = 0.0) -> dict:
    """How much of a DDP step is communication, the way a profiler trace shows it.

    Returns ``{"step_s", "in_flight", "exposed"}``: the step time, the fraction of the step during which a
    collective is in flight (what ``comm_fraction`` measures on a trace: overlapped time counted once), and
    the fraction during which the step does nothing but wait for the network (what overlap cannot hide).
    """
    step = ddp_step_time(compute_s, comm_s, overlap)
    if step == 0:
        return {"step_s": 0.0, "in_flight": 0.0, "exposed": 0.0}
    hidden = min(overlap * comm_s, compute_s)
    return {"step_s": step, "in_flight": comm_s / step, "exposed": (comm_s - hidden) / step}
