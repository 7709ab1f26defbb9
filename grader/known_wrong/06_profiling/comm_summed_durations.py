# replaces: comm_fraction
# loses: test_comm_fraction
# mistake: adds up the collectives' durations, so overlapped communication (the same all-reduce seen on the caller and on gloo's thread, overlapping buckets) is counted twice and the fraction can exceed 1
def comm_fraction(events, is_comm=is_communication):
    """Fraction of one step's span during which at least one collective is in flight (see the contract)."""
    events = list(events)
    if not events:
        raise ValueError("comm_fraction() got an empty trace")
    start = min(e["ts"] for e in events)
    end = max(e["ts"] + e["dur"] for e in events)
    if end <= start:
        raise ValueError("comm_fraction(): the step span has zero length")
    comm_time = sum(e["dur"] for e in events if is_comm(e["name"]))
    return comm_time / (end - start)
