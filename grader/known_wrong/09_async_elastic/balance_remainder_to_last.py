# replaces: load_balance
# loses: test_load_balance
# mistake: gives the leftover examples to the last worker
def imbalance(times):
    """(max - min) / mean of the workers' step times."""
    return (max(times) - min(times)) / (sum(times) / len(times))


def balanced_batches(speeds, global_batch):
    """Batch sizes proportional to speed, integers summing to global_batch (largest remainder, ties to lower index)."""
    total = sum(speeds)
    quotas = [global_batch * s / total for s in speeds]
    sizes = [int(math.floor(q)) for q in quotas]
    left = global_batch - sum(sizes)
    by_remainder = sorted(range(len(speeds)), key=lambda i: (-(quotas[i] - sizes[i]), i))
    sizes[-1] += left
    return sizes


def combine_gradients(grads, batch_sizes):
    """Average of per-worker mean gradients, weighted by batch size."""
    total = sum(batch_sizes)
    out = torch.zeros_like(grads[0])
    for g, b in zip(grads, batch_sizes):
        out = out + b * g
    return out / total
