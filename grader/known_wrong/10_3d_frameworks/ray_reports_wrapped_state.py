# replaces: ray_train
# loses: test_ray_train
# mistake: reports the DDP-wrapped model's state_dict (every key prefixed 'module.')
# nightly: its grading re-runs a Ray Train fit (about a minute on 2 cores); ray_one_worker proves test_ray_train on every push
def ray_train_loop(config):
    """One Ray Train worker: Lab 01's DDP loop with prepare_model; returns state, losses, world_size, backend."""
    import ray.train.torch

    data = dataset(*regression(n=config["n"], seed=config["seed"]))
    model = ray.train.torch.prepare_model(mlp(seed=config["seed"]))
    sampler = DistributedSampler(data, shuffle=True, seed=config["seed"])
    loader = DataLoader(data, batch_size=config["batch_size"], sampler=sampler)
    opt = torch.optim.SGD(model.parameters(), lr=config["lr"])
    losses, epoch = [], 0
    while len(losses) < config["steps"]:
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = F.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            if len(losses) == config["steps"]:
                break
        epoch += 1
    inner = model
    return {"state": {k: v.detach().cpu().tolist() for k, v in inner.state_dict().items()}, "losses": losses,
            "world_size": dist.get_world_size(), "backend": dist.get_backend()}


def fit_with_ray(config, num_workers):
    """Run ray_train_loop on `num_workers` CPU workers of the local Ray instance; return rank 0's return value."""
    import tempfile

    ray_instance()
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    with tempfile.TemporaryDirectory(prefix="ray-results-") as storage:   # removed when fit() is done
        trainer = TorchTrainer(ray_train_loop, train_loop_config=config,
                               scaling_config=ScalingConfig(num_workers=num_workers, use_gpu=False),
                               run_config=RunConfig(storage_path=storage, name="lab10"))
        return trainer.fit().return_value
