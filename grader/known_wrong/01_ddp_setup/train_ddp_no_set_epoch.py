# replaces: train_ddp
# loses: test_train_ddp
# mistake: never calls sampler.set_epoch, so every epoch replays epoch 0's shuffle and the run drifts from large-batch training from the first step of the second epoch
def train_ddp(model, data, steps, batch_size, lr, seed):
    """Data-parallel SGD with DistributedDataParallel; same contract as train_data_parallel."""
    device = rank_device()
    model = model.to(device)
    ddp_model = DDP(model, device_ids=[device.index]) if device.type == "cuda" else DDP(model)
    sampler = DistributedSampler(data, shuffle=True, seed=seed)
    loader = DataLoader(data, batch_size=batch_size, sampler=sampler)
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=lr)
    losses = []
    while len(losses) < steps:
        for x, y in loader:
            loss = F.mse_loss(ddp_model(x.to(device)), y.to(device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            if len(losses) == steps:
                break
    return {k: v.detach().cpu().clone() for k, v in ddp_model.module.state_dict().items()}, losses
