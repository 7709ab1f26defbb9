# replaces: DDPIndividualParameters
# loses: test_ddp_overlap
# mistake: waits for backward to finish and only then all-reduces every gradient: same weights, no overlap
class DDPIndividualParameters(nn.Module):
    # Data parallelism from hooks: one asynchronous all-reduce per parameter, started as soon as its gradient is ready.

    def __init__(self, module):
        super().__init__()
        self.module = module
        self.world_size = dist.get_world_size()
        self.handles = []
        with torch.no_grad():
            for tensor in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(tensor, src=0)


    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self):
        for p in self.module.parameters():     # backward is over: now send everything
            if p.grad is not None:
                p.grad.div_(self.world_size)
                self.handles.append(dist.all_reduce(p.grad, async_op=True))
        for handle in self.handles:
            handle.wait()
        self.handles.clear()
