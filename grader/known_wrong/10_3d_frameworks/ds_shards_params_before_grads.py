# replaces: deepspeed_config
# loses: test_deepspeed_config
# mistake: thinks stage 2 partitions the parameters and stage 3 adds the gradients
# nightly: a second DeepSpeed mistake; its grading re-runs ZeRO training (ds_train_stage0 and ds_config_fixed_train_batch prove these cells on every push)
def deepspeed_config(stage, micro_batch_size, lr):
    """DeepSpeed config: ZeRO `stage`, fp32, torch's Adam(lr) without weight decay, one micro-batch per step."""
    return {
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "Adam", "params": {"lr": lr, "torch_adam": True, "weight_decay": 0.0}},
        "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
        "gradient_clipping": 0.0,
        "fp16": {"enabled": False},
        "bf16": {"enabled": False},
        "steps_per_print": 10**9,
    }


def zero_shards(stage):
    """What ZeRO `stage` partitions across the data-parallel ranks: a subset of {"optimizer", "gradients", "parameters"}."""
    return set(["optimizer", "parameters", "gradients"][:stage])


def zero_bytes_fp32(num_params, world_size, stage):
    """Bytes per rank of parameters, gradients and optimizer state (fp32 Adam under ZeRO `stage` 1-3)."""
    psi, n = num_params, world_size
    return {"parameters": 4 * psi / n if stage >= 3 else 4 * psi,
            "gradients": 4 * psi / n if stage >= 2 else 4 * psi,
            "optimizer": 12 * psi / n}
