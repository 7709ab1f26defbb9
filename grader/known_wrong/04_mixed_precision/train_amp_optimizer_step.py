# replaces: train_amp
# loses: test_train_amp
# mistake: with a scaler, scales the loss and calls scaler.update() but steps with opt.step() instead of scaler.step(opt)
def train_amp(model, x, y, steps, lr=0.05, amp_dtype=torch.bfloat16, scaler=None):
    """Full-batch SGD on MSE with the forward pass and the loss under autocast; returns the per-step losses."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=x.device.type, dtype=amp_dtype):
            loss = F.mse_loss(model(x), y)
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            opt.step()
            scaler.update()
        losses.append(loss.item())
    return losses
