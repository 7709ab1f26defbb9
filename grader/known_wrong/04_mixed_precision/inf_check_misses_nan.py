# replaces: DynamicLossScaler
# loses: test_loss_scaler_basics, test_loss_scaler_matches_gradscaler
# mistake: checks gradients with isinf, so a NaN gradient is not detected: the step is taken and the scale kept
class DynamicLossScaler:
    def __init__(self, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
        self._scale = float(init_scale)
        self.growth_factor = float(growth_factor)
        self.backoff_factor = float(backoff_factor)
        self.growth_interval = int(growth_interval)
        self._clean_steps = 0
        self._unscaled = False
        self._found_inf = False

    def scale(self, loss):
        return loss * self._scale

    def unscale_(self, optimizer):
        if self._unscaled:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update().")
        found_inf = False
        with torch.no_grad():
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    p.grad.div_(self._scale)
                    if torch.isinf(p.grad).any():  # NaN is not inf: it slips through
                        found_inf = True
        self._found_inf = found_inf
        self._unscaled = True

    def step(self, optimizer):
        if not self._unscaled:
            self.unscale_(optimizer)
        if self._found_inf:
            return None
        return optimizer.step()

    def update(self):
        if self._found_inf:
            self._scale *= self.backoff_factor
            self._clean_steps = 0
        else:
            self._clean_steps += 1
            if self._clean_steps == self.growth_interval:
                self._scale *= self.growth_factor
                self._clean_steps = 0
        self._unscaled = False
        self._found_inf = False

    def get_scale(self):
        return self._scale
