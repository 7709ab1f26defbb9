# replaces: accumulate_gradients
# loses: test_accumulate_gradients
# mistake: adds up the weighted micro-batch losses and calls backward() once: right gradient, but every micro-batch's activations stay alive until the end (the memory of the large batch)
def accumulate_gradients(model, loss_fn, micro_batches):
    model.zero_grad()
    n = sum(len(x) for x, _ in micro_batches)
    loss = sum(loss_fn(model(x), y) * len(x) / n for x, y in micro_batches)
    loss.backward()
    return loss.item()
