# replaces: train
# loses: test_train_restart
# mistake: does not save or restore the RNG state: after the restart every rank draws the dropout masks of step 0 again
# nightly: another resuming mistake; its grading re-runs the restarted torchrun job (about 6 s on an idle machine); resume_restarts_data_stream and rank0_rng_for_every_rank prove test_train_restart on every push
def train(cfg):
    """Train make_model data-parallel for cfg["steps"] steps; resume from cfg["ckpt_path"]; return final weights.

    Runs on every rank of an initialised process group. Checkpoints every cfg["ckpt_every"] steps.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    model = make_model(cfg["seed"])  # the same initial weights on every rank
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg["lr"])
    X, Y = make_data(cfg["seed"], cfg["data_n"])
    sampler = DistributedSampler(range(len(X)), num_replicas=world, rank=rank, shuffle=True, seed=cfg["seed"],
                                 drop_last=True)
    batches_per_epoch = len(sampler) // cfg["batch"]
    torch.manual_seed(cfg["seed"] + 1 + rank)  # each rank its own dropout masks
    step = 0

    checkpoint = load_checkpoint(cfg["ckpt_path"])
    if checkpoint is not None:
        # 1. resume: model, optimizer, step and this rank's RNG state
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        step = checkpoint["step"]
    while step < cfg["steps"]:
        fail_once(step)
        # 2. idx: the indices of this step's batch (set_epoch, then the offset-th slice of list(sampler))
        epoch, offset = divmod(step, batches_per_epoch)
        sampler.set_epoch(epoch)
        idx = list(sampler)[offset * cfg["batch"]:(offset + 1) * cfg["batch"]]
        loss = F.mse_loss(model(X[idx]), Y[idx])
        optimizer.zero_grad()
        loss.backward()
        for p in model.parameters():  # data parallel: average the gradients over the ranks (DDP's job)
            dist.all_reduce(p.grad)
            p.grad /= world
        optimizer.step()
        step += 1
        if step % cfg["ckpt_every"] == 0:
            # 3. build the checkpoint on every rank (gather every rank's RNG state), then save_checkpoint
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
            save_checkpoint(state, cfg["ckpt_path"], rank)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}
