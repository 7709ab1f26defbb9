# replaces: DDPBucketed
# loses: test_ddp_bucketed
# mistake: fills the buckets in forward order of model.parameters() instead of reverse (backward) order
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
        for p in module.parameters():
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
            if self.ready[b] == len(self.buckets[b]):          # the bucket's last gradient: send it as one tensor
                flat = torch.cat([p.grad.flatten() for p in self.buckets[b]])
                self.pending.append((b, flat, dist.all_reduce(flat, async_op=True)))

        for b, params in enumerate(self.buckets):
            for p in params:
                p.register_post_accumulate_grad_hook(lambda param, b=b: hook(param, b))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self):
        for b, flat, handle in self.pending:
            handle.wait()
            flat.div_(self.world_size)
            offset = 0
            for p in self.buckets[b]:
                n = p.numel()
                p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
                offset += n
        self.pending.clear()
        self.ready = [0] * len(self.buckets)
