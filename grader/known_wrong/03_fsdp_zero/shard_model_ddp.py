# replaces: shard_model
# loses: test_fsdp_matches_ddp
# mistake: wraps the model in DistributedDataParallel instead of sharding it: the loss matches DDP (it is DDP),
#          but every rank still holds all the parameters, gradients and optimizer state
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP


def shard_model(model):
    return DDP(model)
