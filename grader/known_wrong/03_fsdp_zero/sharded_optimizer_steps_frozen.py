# replaces: ShardedOptimizer
# loses: test_sharded_optimizer_matches_adamw
# mistake: steps frozen parameters (requires_grad=False) as if their gradient were zero, so weight decay
#          and Adam still move them
class ShardedOptimizer:
    """ZeRO stage 1: AdamW whose state is partitioned across the ranks of the default process group.

    Rank r owns elements [r*chunk, (r+1)*chunk) of every parameter, chunk = ceil(numel / world_size). ``step()``
    updates the owned slice with AdamW (same maths as torch.optim.AdamW) and all-gathers the slices, so every
    rank ends with the same, fully updated parameters. Use it with gradients already averaged across ranks
    (e.g. a DDP-wrapped model).
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.state = {}  # parameter -> {"step": int, "exp_avg": tensor, "exp_avg_sq": tensor}, own slice only
        self.params, seen = [], set()
        for p in params:
            if id(p) not in seen:  # tied: listed once
                seen.add(id(p))
                self.params.append(p)

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    def shard_bounds(self, numel):
        """(lo, hi): the elements of a flattened parameter of ``numel`` elements that this rank owns."""
        chunk = math.ceil(numel / self.world_size)
        lo = min(self.rank * chunk, numel)
        return lo, min(lo + chunk, numel)

    @torch.no_grad()
    def step(self):
        beta1, beta2 = self.betas
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        stepped = self.params
        for p in stepped:  # 1. AdamW on the slice this rank owns
            lo, hi = self.shard_bounds(p.numel())
            if hi == lo:
                continue
            w = p.view(-1)[lo:hi]
            g = p.grad.reshape(-1)[lo:hi]
            if p not in self.state:
                self.state[p] = {"step": 0, "exp_avg": torch.zeros_like(w), "exp_avg_sq": torch.zeros_like(w)}
            st = self.state[p]
            st["step"] += 1
            m, v, t = st["exp_avg"], st["exp_avg_sq"], st["step"]
            w.mul_(1 - self.lr * self.weight_decay)
            m.lerp_(g, 1 - beta1)
            v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            denom = (v.sqrt() / math.sqrt(1 - beta2**t)).add_(self.eps)
            w.addcdiv_(m, denom, value=-self.lr / (1 - beta1**t))
        for p in stepped:  # 2. everyone gets everyone's updated slice
            chunk = math.ceil(p.numel() / self.world_size)
            lo, hi = self.shard_bounds(p.numel())
            mine = torch.zeros(chunk, dtype=p.dtype, device=p.device)
            mine[: hi - lo] = p.view(-1)[lo:hi]
            slices = [torch.empty_like(mine) for _ in range(self.world_size)]
            dist.all_gather(slices, mine)
            p.view(-1).copy_(torch.cat(slices)[: p.numel()])
