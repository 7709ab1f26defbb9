# replaces: DDPBucketed
# loses: test_ddp_bucketed
# mistake: builds the buckets but launches one all-reduce per parameter as each gradient arrives (per-parameter DDP)
class DDPBucketed(nn.Module):
    # Data parallelism with buckets: parameters grouped in reverse order, one asynchronous all-reduce per full bucket.

    def __init__(self, module, bucket_size_mb):
        super().__init__()
        self.module = module
        self.world_size = dist.get_world_size()
        with torch.no_grad():
            for tensor in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(tensor, src=0)
        cap = bucket_size_mb * 1024 * 1024
        self.buckets, current, current_bytes = [], [], 0
        for p in reversed(list(module.parameters())):
            if not p.requires_grad:
                continue
            size = p.numel() * p.element_size()
            if current and current_bytes + size > cap:
                self.buckets.append(current)
                current, current_bytes = [], 0
            current.append(p)
            current_bytes += size
        if current:
            self.buckets.append(current)
        self.ready = [0] * len(self.buckets)  # gradients ready so far, per bucket
        self.pending = []                      # (bucket index, flat tensor, handle)

        def hook(param, b):
            self.ready[b] += 1
            self.pending.append((param, dist.all_reduce(param.grad, async_op=True)))

        for b, params in enumerate(self.buckets):
            for p in params:
                p.register_post_accumulate_grad_hook(lambda param, b=b: hook(param, b))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self):
        for p, handle in self.pending:
            handle.wait()
            p.grad.div_(self.world_size)
        self.pending.clear()
        self.ready = [0] * len(self.buckets)
