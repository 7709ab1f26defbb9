# replaces: checkpoint_interval
# loses: test_checkpoint_interval
# mistake: 'frequency = checkpoint time / MTBF'
def young_daly_interval(checkpoint_cost, mtbf):
    """The checkpoint interval sqrt(2 C M) (seconds of work between checkpoints)."""
    return checkpoint_cost / mtbf


def expected_lost_work(interval):
    """Expected seconds of work lost at one failure when checkpointing every `interval` seconds."""
    return interval / 2.0


def checkpoint_overhead(interval, checkpoint_cost, mtbf):
    """Fraction of time wasted: writing checkpoints plus work lost to failures."""
    return checkpoint_cost / interval + interval / (2.0 * mtbf)
