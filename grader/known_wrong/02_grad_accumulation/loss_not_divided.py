# replaces: accumulate_gradients
# loses: test_accumulate_gradients
# mistake: back-propagates every micro-batch's mean loss at full weight (never divides by the number of micro-batches), so the gradient is K times the full-batch gradient
def accumulate_gradients(model, loss_fn, micro_batches):
    model.zero_grad()
    losses = []
    for x, y in micro_batches:
        loss = loss_fn(model(x), y)
        loss.backward()
        losses.append(loss.item())
    return sum(losses) / len(losses)
