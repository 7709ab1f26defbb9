# replaces: mesh_3d_groups
# loses: test_mesh_3d_groups
# mistake: puts PP innermost: rank = (tp_i * dp + dp_i) * pp + pp_i
# nightly: one more 8-rank mesh; mesh_tp_outermost proves test_mesh_3d_groups on every push
def mesh_3d_groups(pp, dp, tp):
    """All groups of a (pp, dp, tp) mesh, rank = (pp_i * dp + dp_i) * tp + tp_i: {"pp": [...], "dp": [...], "tp": [...]}."""
    def rank(p, d, t):
        return (t * dp + d) * pp + p

    return {
        "pp": sorted([rank(p, d, t) for p in range(pp)] for d in range(dp) for t in range(tp)),
        "dp": sorted([rank(p, d, t) for d in range(dp)] for p in range(pp) for t in range(tp)),
        "tp": sorted([rank(p, d, t) for t in range(tp)] for p in range(pp) for d in range(dp)),
    }
