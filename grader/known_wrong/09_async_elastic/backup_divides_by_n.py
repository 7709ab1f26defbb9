# replaces: backup_workers
# loses: test_backup_workers
# mistake: averages the N - b gradients used but divides by N
def backup_step(grads, times, b):
    """Wait for the first N - b gradients; returns (step_time, sorted ids used, mean of their gradients)."""
    order = sorted(range(len(times)), key=lambda i: (times[i], i))
    used = sorted(order[:len(times) - b])
    step_time = times[order[len(times) - b - 1]]
    grad = torch.stack([grads[i] for i in used]).sum(0) / len(times)
    return step_time, used, grad


def speculative_step_time(times):
    """Step time when the first idle worker re-executes the slowest shard."""
    n = len(times)
    fast = min(range(n), key=lambda i: (times[i], i))
    slow = min(range(n), key=lambda i: (-times[i], i))
    if slow == fast:  # one worker, or nobody slower than the first to finish
        return times[slow]
    done = list(times)
    done[slow] = min(times[slow], times[fast] + times[fast])
    return max(done)
