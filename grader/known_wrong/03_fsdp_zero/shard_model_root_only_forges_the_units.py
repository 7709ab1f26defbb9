# replaces: shard_model
# loses: test_fsdp_matches_ddp
# mistake: calls fully_shard(model) on the root only (the whole model is gathered at once), and dresses every block up as an FSDP unit for a census taken in this process: each block's class becomes a subclass of FSDPModule, without any sharding
from torch.distributed.fsdp import FSDPModule, fully_shard


def shard_model(model):
    fully_shard(model)
    for block in model.blocks:
        block.__class__ = type(f"FSDP{type(block).__name__}", (FSDPModule, type(block)), {})
    return model
