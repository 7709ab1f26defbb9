# replaces: scaling_table
# loses: test_scaling_table
# mistake: counts the 3D model's parameters for one pipeline stage (one block) instead of both stages
CLUSTER = {"devices": 64, "peak_flops": 989e12, "mfu": 0.4}   # 64 H100 SXM, dense bf16, 40% MFU


def scaling_table():
    """{name: {"params", "tokens", "flops", "days"}} for mlp(), tiny_transformer(), this lab's 3D model (2 stages x
    1 block, dim 8, hidden 16) and a 7B model, in that order: Chinchilla-optimal runs on CLUSTER."""
    from lab_utils.labkit.models import tiny_transformer

    def row(num_params):
        tokens = 20 * num_params
        return {"params": num_params, "tokens": tokens, "flops": training_flops(num_params, tokens),
                "days": training_days(num_params, tokens, CLUSTER["devices"], CLUSTER["peak_flops"], CLUSTER["mfu"])}

    blocks = block_weights(1, 8, 16, SEED)   # one block: the model of one pipeline stage
    return {
        "Lab 01 mlp()": row(sum(p.numel() for p in mlp().parameters())),
        "Lab 03 tiny_transformer()": row(sum(p.numel() for p in tiny_transformer().parameters())),
        "this lab's 3D model (2 stages x 1 block, dim 8, hidden 16)": row(sum(w.numel() for block in blocks for w in block)),
        "7B": row(7e9),
    }
