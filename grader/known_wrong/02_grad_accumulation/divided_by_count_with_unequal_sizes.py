# replaces: accumulate_gradients
# loses: test_accumulate_gradients
# mistake: divides each micro-batch loss by K, which is right only when all micro-batches have the same size; a short last micro-batch gets too much weight
def accumulate_gradients(model, loss_fn, micro_batches):
    model.zero_grad()
    k = len(micro_batches)
    total = 0.0
    for x, y in micro_batches:
        loss = loss_fn(model(x), y) / k
        loss.backward()
        total += loss.item()
    return total
