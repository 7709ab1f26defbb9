# replaces: checkpoint_cost
# loses: test_checkpoint_cost
# mistake: peak uses L // k for the longest segment, forgetting that uneven segments make the longest one ceil(L / k)
def checkpoint_cost(num_layers, segments, act_bytes):
    """The memory/compute trade of checkpointing num_layers equal layers in `segments` pieces (0 = off)."""
    if segments == 0:
        return {"kept_bytes": (num_layers + 1) * act_bytes, "peak_bytes": (num_layers + 1) * act_bytes,
                "recomputed_layers": 0}
    longest = num_layers // segments
    return {"kept_bytes": segments * act_bytes, "peak_bytes": (segments + longest) * act_bytes,
            "recomputed_layers": num_layers}
