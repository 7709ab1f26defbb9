# replaces: pipeline_timeline
# loses: test_pipeline_timeline
# mistake: timeline that only serialises each stage's own operations and never waits for the neighbouring stage, so there is no bubble
def pipeline_timeline(orders, t_f=1.0, t_b=2.0):
    """Start and end of every operation: timeline[s] = [(kind, i, start, end), ...] in the order of orders[s]."""
    world = len(orders)
    done = {}                                   # (kind, stage, i) -> end time
    timeline = [[] for _ in range(world)]
    position, clock = [0] * world, [0.0] * world
    while any(position[s] < len(orders[s]) for s in range(world)):
        progressed = False
        for s in range(world):
            while position[s] < len(orders[s]):
                kind, i = orders[s][position[s]]
                if kind == "F":
                    dep = ("F", s - 1, i) if s > 0 else None
                else:
                    dep = ("B", s + 1, i) if s < world - 1 else ("F", s, i)
                if dep is not None and dep not in done:
                    break                       # wait for the other stage
                start = clock[s]
                end = start + (t_f if kind == "F" else t_b)
                timeline[s].append((kind, i, start, end))
                done[(kind, s, i)], clock[s] = end, end
                position[s] += 1
                progressed = True
        if not progressed:
            raise ValueError("these orders deadlock: every stage waits for another")
    return timeline


def bubble_fraction(timeline):
    """Idle share of all stages' time between 0 and the last end."""
    makespan = max(end for ops in timeline for _, _, _, end in ops)
    busy = sum(end - start for ops in timeline for _, _, start, end in ops)
    return 1.0 - busy / (len(timeline) * makespan)


def bubble_formula(num_stages, num_micro_batches):
    """The pipeline bubble (P - 1) / (m + P - 1) of GPipe and 1F1B with equal micro-batches."""
    return (num_stages - 1) / (num_micro_batches + num_stages - 1)
