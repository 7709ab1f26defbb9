"""Assertions for test cells that read like a tutor's comment: what was expected, what came out, where.

The pattern (CS336 assignment 2): compare the distributed answer against a non-parallel reference computed
on the union of the shards, and say *which rank, which parameter, which step, by how much* when they differ.
Every helper raises ``AssertionError`` (what nbgrader counts as a failed test) with a message for students.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence


def _as_tensor(x):
    import torch

    return x.detach().cpu() if isinstance(x, torch.Tensor) else torch.as_tensor(x)


def assert_close(got, expected, *, what: str, atol: float = 1e-6, rtol: float = 1e-5, hint: str = "") -> None:
    """Tensors (or numbers) equal within tolerance; the message names ``what`` and the worst element."""
    import torch

    g, e = _as_tensor(got), _as_tensor(expected)
    if g.shape != e.shape:
        raise AssertionError(
            f"{what}: expected shape {tuple(e.shape)}, got {tuple(g.shape)}." + (f" {hint}" if hint else "")
        )
    g64, e64 = g.to(torch.float64), e.to(torch.float64)
    if torch.allclose(g64, e64, atol=atol, rtol=rtol, equal_nan=True):
        return
    diff = (g64 - e64).abs()
    diff = torch.where(torch.isnan(diff), torch.full_like(diff, float("inf")), diff)
    idx = int(diff.flatten().argmax()) if diff.numel() else 0
    where = "" if g.dim() == 0 else f" at index {tuple(int(i) for i in torch.unravel_index(torch.tensor(idx), g.shape))}"
    gv = g64.flatten()[idx].item() if g.numel() else None
    ev = e64.flatten()[idx].item() if e.numel() else None
    ratio = ""
    if ev not in (None, 0) and gv is not None and gv != 0:
        ratio = f" (got/expected = {gv / ev:.4g})"
    raise AssertionError(
        f"{what}: largest difference {diff.max().item():.3g}{where}: expected {ev:.6g}, got {gv:.6g}{ratio}; "
        f"tolerance atol={atol:g}, rtol={rtol:g}." + (f" {hint}" if hint else "")
    )


def assert_state_close(got: Mapping, expected: Mapping, *, what: str = "parameters", atol=1e-6, rtol=1e-5,
                       hint: str = "") -> None:
    """Two state dicts (name -> tensor) agree; the message names the first parameter that differs."""
    missing = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    if missing or extra:
        raise AssertionError(f"{what}: missing {missing}, unexpected {extra}." + (f" {hint}" if hint else ""))
    for name in expected:
        assert_close(got[name], expected[name], what=f"{what}[{name!r}]", atol=atol, rtol=rtol, hint=hint)


def assert_ranks_agree(per_rank: Sequence, *, what: str, atol=0.0, rtol=0.0, hint: str = "") -> None:
    """Every rank returned the same tensor / state dict as rank 0 (e.g. weights after a DDP step)."""
    first = per_rank[0]
    for rank, value in enumerate(per_rank[1:], start=1):
        label = f"{what} on rank {rank} vs rank 0"
        if isinstance(first, Mapping):
            assert_state_close(value, first, what=label, atol=atol, rtol=rtol, hint=hint)
        else:
            assert_close(value, first, what=label, atol=atol, rtol=rtol, hint=hint)


def assert_equal(got, expected, *, what: str, hint: str = "") -> None:
    """Exact equality of plain values (ints, lists, strings) with a readable message."""
    if got != expected:
        raise AssertionError(f"{what}: expected {expected!r}, got {got!r}." + (f" {hint}" if hint else ""))
