# replaces: scaled_lr
# loses: test_scaled_lr
# mistake: square-root scaling instead of the linear rule (0.1 * sqrt(32) = 0.57 at batch 8192, not 3.2)
import math


def scaled_lr(base_lr, batch_size, base_batch_size=256):
    return base_lr * math.sqrt(batch_size / base_batch_size)
