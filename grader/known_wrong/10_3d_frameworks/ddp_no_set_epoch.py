# replaces: train_ddp
# loses: test_train_ddp
# mistake: never calls sampler.set_epoch: every epoch repeats the first shuffle
def train_ddp(model, data, steps, batch_size, lr, seed, optimizer="sgd"):
    """Your Lab 01 train_ddp, with optimizer "sgd" (SGD(lr)) or "adam" (Adam(lr)). Returns (state, losses)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    device = rank_device()
    model = model.to(device)
    ddp_model = DDP(model, device_ids=[device.index]) if device.type == "cuda" else DDP(model)
    sampler = DistributedSampler(data, shuffle=True, seed=seed)
    loader = DataLoader(data, batch_size=batch_size, sampler=sampler)
    opt = (torch.optim.Adam if optimizer == "adam" else torch.optim.SGD)(ddp_model.parameters(), lr=lr)
    losses, epoch = [], 0
    while len(losses) < steps:
        for x, y in loader:
            loss = F.mse_loss(ddp_model(x.to(device)), y.to(device))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            if len(losses) == steps:
                break
        epoch += 1
    return {k: v.detach().cpu().clone() for k, v in ddp_model.module.state_dict().items()}, losses
