# replaces: train_deepspeed
# loses: test_train_deepspeed
# mistake: calls loss.backward() instead of engine.backward(loss): DeepSpeed 0.19.8 accepts it under ZeRO 1-3, and refuses it under stage 0
def train_deepspeed(model, data, steps, batch_size, config, seed):
    """Data-parallel training with a DeepSpeed engine built from `config`; returns (engine, losses)."""
    deepspeed = deepspeed_on_cpu()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    sampler = DistributedSampler(data, shuffle=True, seed=seed)
    loader = DataLoader(data, batch_size=batch_size, sampler=sampler)
    losses, epoch = [], 0
    while len(losses) < steps:
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = F.mse_loss(engine(x.to(engine.device)), y.to(engine.device))
            loss.backward()
            engine.step()
            losses.append(loss.item())
            if len(losses) == steps:
                break
        epoch += 1
    return engine, losses


def full_weights(engine):
    """The engine's full weights, {name: CPU tensor}, on every rank (gathered under ZeRO-3)."""
    deepspeed = deepspeed_on_cpu()
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):
        return {k: v.detach().cpu().clone() for k, v in engine.module.state_dict().items()}
