# replaces: DDPIndividualParameters
# loses: test_ddp_individual_parameters
# mistake: registers hooks over named_parameters(remove_duplicate=False): the tied matrix is hooked, divided and all-reduced twice
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

        def hook(param):
            param.grad.div_(self.world_size)   # average = sum of (grad / N)
            self.handles.append(dist.all_reduce(param.grad, async_op=True))

        for _, p in module.named_parameters(remove_duplicate=False):
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(hook)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self):
        for handle in self.handles:
            handle.wait()
        self.handles.clear()
