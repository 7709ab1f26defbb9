# replaces: warmup_lr
# loses: test_warmup_lr
# mistake: counts steps from 1 (step + 1), so the first step never runs at start_lr and the target is reached one step early
def warmup_lr(step, target_lr, warmup_steps, start_lr=0.0):
    if step + 1 >= warmup_steps:
        return target_lr
    return start_lr + (target_lr - start_lr) * (step + 1) / warmup_steps
