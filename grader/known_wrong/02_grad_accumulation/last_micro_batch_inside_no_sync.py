# replaces: ddp_accumulate_gradients
# loses: test_ddp_accumulate_gradients
# mistake: runs every micro-batch, the last one included, inside no_sync(), so DDP never all-reduces and each rank steps with its own gradient
def ddp_accumulate_gradients(ddp_model, loss_fn, micro_batches):
    ddp_model.zero_grad()
    n = sum(len(x) for x, _ in micro_batches)
    total = 0.0
    with ddp_model.no_sync():
        for x, y in micro_batches:
            loss = loss_fn(ddp_model(x), y) * len(x) / n
            loss.backward()
            total += loss.item()
    return total
