"""Synthetic data generated in code (nothing is downloaded), identical on every rank for a given seed."""
from __future__ import annotations


def regression(n: int = 256, in_dim: int = 8, out_dim: int = 1, seed: int = 0, noise: float = 0.1):
    """(X, y) with y = X @ W + noise: a problem every model in the labs can fit in a few steps."""
    import torch

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, in_dim, generator=g)
    w = torch.randn(in_dim, out_dim, generator=g)
    y = x @ w + noise * torch.randn(n, out_dim, generator=g)
    return x, y


def classification(n: int = 256, in_dim: int = 8, classes: int = 4, seed: int = 0):
    """(X, labels) from Gaussian blobs, one per class."""
    import torch

    g = torch.Generator().manual_seed(seed)
    centers = 2.0 * torch.randn(classes, in_dim, generator=g)
    labels = torch.randint(0, classes, (n,), generator=g)
    x = centers[labels] + torch.randn(n, in_dim, generator=g)
    return x, labels


def tokens(n_seqs: int = 64, seq_len: int = 16, vocab: int = 32, seed: int = 0):
    """Token sequences with a learnable pattern (next token = previous + 1 mod vocab, with noise)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, vocab, (n_seqs, 1), generator=g)
    seq = (start + torch.arange(seq_len + 1)) % vocab
    flip = torch.rand(seq.shape, generator=g) < 0.1
    seq = torch.where(flip, torch.randint(0, vocab, seq.shape, generator=g), seq)
    return seq[:, :-1], seq[:, 1:]


def dataset(x, y):
    import torch

    return torch.utils.data.TensorDataset(x, y)
