# replaces: train_data_parallel
# loses: test_train_data_parallel
# mistake: never broadcasts rank 0's weights, so ranks that initialised their models differently (each with its own seed) apply the same averaged updates to different weights and never agree
def train_data_parallel(model, data, steps, batch_size, lr, seed):
    """Data-parallel SGD by hand: broadcast, DistributedSampler + set_epoch, average_gradients. Returns (state, losses)."""
    device = rank_device()
    model = model.to(device)
    sampler = DistributedSampler(data, shuffle=True, seed=seed)
    loader = DataLoader(data, batch_size=batch_size, sampler=sampler)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses, epoch = [], 0
    while len(losses) < steps:
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = F.mse_loss(model(x.to(device)), y.to(device))
            optimizer.zero_grad()
            loss.backward()
            average_gradients(model)
            optimizer.step()
            losses.append(loss.item())
            if len(losses) == steps:
                break
        epoch += 1
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}, losses
