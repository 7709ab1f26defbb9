# replaces: mesh_groups
# loses: test_mesh_groups, test_build_2d_groups
# mistake: mesh groups built transposed: TP groups are the columns (ranks tp apart) and DP groups the rows
def mesh_groups(world_size, tp_size):
    """{"tp": rows of the (dp, tp) grid, "dp": its columns}, rank = dp_index * tp_size + tp_index."""
    dp = world_size // tp_size
    return {"dp": [[d * tp_size + t for t in range(tp_size)] for d in range(dp)],
            "tp": [[d * tp_size + t for d in range(dp)] for t in range(tp_size)]}


def dp_size(world_size, tp_size, pp_size=1):
    """Data-parallel replicas: world / (TP x PP)."""
    return world_size // (tp_size * pp_size)


def collective_dimension():
    """Which mesh dimension ("dp" or "tp") each collective of a DP x TP step crosses."""
    return {"row-parallel output all-reduce": "tp", "input-gradient all-reduce": "tp",
            "gradient averaging all-reduce": "dp"}
