# replaces: ddp_accumulate_gradients
# loses: test_ddp_accumulate_gradients
# mistake: no no_sync(): DDP all-reduces in every micro-batch's backward (K times the communication; the gradients still come out right, only the all-reduce count shows it)
def ddp_accumulate_gradients(ddp_model, loss_fn, micro_batches):
    ddp_model.zero_grad()
    n = sum(len(x) for x, _ in micro_batches)
    total = 0.0
    for x, y in micro_batches:
        loss = loss_fn(ddp_model(x), y) * len(x) / n
        loss.backward()
        total += loss.item()
    return total
