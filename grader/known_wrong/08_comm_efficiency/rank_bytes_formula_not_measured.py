# replaces: rank_state_bytes
# loses: test_rank_state_bytes
# mistake: divides the full size by the world size instead of measuring rank 0's shard (wrong when rows do not divide evenly)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.testing._internal.distributed.fake_pg import FakeStore

WEIGHT_BYTES, GRAD_BYTES, OPTIMIZER_BYTES = 2, 2, 12


def rank_state_bytes(world_size):
    # Rank 0's bytes of weights, gradients and optimizer state under ZeRO stages 0-3, measured on a fake group.
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        mesh = init_device_mesh("cpu", (world_size,))
        model = big_model_on_meta()
        for layer in model:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        full = sum(p.numel() for p in model.parameters())
        shard = full // world_size
    finally:
        dist.destroy_process_group()
    return {stage: {"weights": WEIGHT_BYTES * (shard if stage >= 3 else full),
                    "grads": GRAD_BYTES * (shard if stage >= 2 else full),
                    "optimizer": OPTIMIZER_BYTES * (shard if stage >= 1 else full)} for stage in range(4)}
