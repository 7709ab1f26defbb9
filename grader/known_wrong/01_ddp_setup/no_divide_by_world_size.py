# replaces: average_gradients
# loses: test_average_gradients, test_train_data_parallel
# mistake: all-reduces the gradients but forgets to divide by the world size, so every rank steps with the sum (world_size times the large-batch gradient)
def average_gradients(model):
    """Replace every parameter's gradient by its mean over all ranks (in place)."""
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
