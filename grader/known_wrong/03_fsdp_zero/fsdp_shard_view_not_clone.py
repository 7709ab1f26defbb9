# replaces: FSDP
# loses: test_fsdp_scratch_memory
# mistake: _shard sets p.data to a slice of the padded flat tensor without .clone(): the slice is a view, so every
#          rank keeps the whole flat parameter alive (N times the shard's bytes)
class FSDP(torch.nn.Module):
    """ZeRO-3 from scratch: every rank keeps 1/N of each large parameter, gathers a module's weights just before its
    forward (and again for its backward), and reduce-scatters its gradients so the optimizer steps on the local shard.

    ``compute_dtype`` (torch.float16 / torch.bfloat16): weights are cast before the all-gather and used in that dtype;
    the parameters the optimizer sees stay fp32 (the master copy) and so do their gradients.
    """

    def __init__(self, module, compute_dtype=None, min_shard_numel=1024):
        super().__init__()
        self.module, self.compute_dtype, self.min_shard_numel = module, compute_dtype, min_shard_numel
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.units = {}       # module -> [shard record, ...] for the sharded parameters it owns (records: see _shard)
        self.replicated = []  # trainable parameters kept whole on every rank (too small, or shared by two modules)
        owners = {}
        for mod in module.modules():
            for p in mod.parameters(recurse=False):
                owners.setdefault(id(p), set()).add(mod)
        seen = set()
        for mod in module.modules():
            for name, p in mod.named_parameters(recurse=False):
                if id(p) in seen or not p.requires_grad:  # a tied parameter is listed once; frozen ones stay as they are
                    continue
                seen.add(id(p))
                if p.numel() >= min_shard_numel and len(owners[id(p)]) == 1:
                    self.units.setdefault(mod, []).append(self._shard(name, p))
                else:
                    self.replicated.append(p)
        self._saving = {}
        for mod in self.units:
            mod.register_forward_pre_hook(self._before_forward)
            mod.register_forward_hook(self._after_forward)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _shard(self, name, p):
        """Flatten ``p``, pad it with zeros to world_size * chunk elements (chunk = ceil(numel / world_size)), and
        keep chunk number ``rank`` as the parameter's data (``p.data = ...``, fp32, a tensor of its own). Return the
        record the other methods use: {"name": name, "param": p, "shape": full shape, "numel": full numel,
        "chunk": chunk}."""
        chunk = math.ceil(p.numel() / self.world_size)
        flat = torch.zeros(chunk * self.world_size, dtype=p.dtype, device=p.device)
        flat[: p.numel()] = p.detach().reshape(-1)
        record = {"name": name, "param": p, "shape": p.shape, "numel": p.numel(), "chunk": chunk}
        p.data = flat[self.rank * chunk:(self.rank + 1) * chunk]  # rank r's chunk of the flat tensor
        return record

    def _gather(self, shards):
        """One all-gather for one module: this rank's shards, cast to the compute dtype, concatenated; every rank's
        concatenation comes back. Return the full parameters, in the order of ``shards``, each a contiguous tensor
        of its own with its original shape."""
        dtype = self.compute_dtype or shards[0]["param"].dtype
        mine = torch.cat([s["param"].detach().to(dtype) for s in shards])
        everyone = torch.empty(self.world_size * mine.numel(), dtype=dtype, device=mine.device)
        all_gather_single(everyone, mine)
        everyone = everyone.view(self.world_size, mine.numel())  # row r: rank r's shards, one after the other
        full, offset = [], 0
        for s in shards:
            full.append(everyone[:, offset:offset + s["chunk"]].reshape(-1)[: s["numel"]].view(s["shape"]).clone())
            offset += s["chunk"]
        return full

    def _reduce_scatter(self, shards, grads):
        """One reduce-scatter for one module. ``grads``: the full gradients of this rank's batch, in the compute
        dtype (None: no gradient). Every rank receives the sum over ranks of its own chunks; divide by world_size
        (a mean over the union of the batches) and return one fp32 tensor per shard, shaped like the shard."""
        columns = []
        for s, g in zip(shards, grads):
            padded = torch.zeros(self.world_size * s["chunk"], dtype=torch.float32, device=s["param"].device)
            if g is not None:
                padded[: s["numel"]] = g.reshape(-1)
            columns.append(padded.view(self.world_size, s["chunk"]))
        send = torch.cat(columns, dim=1).reshape(-1)  # rank r's chunk of every parameter, rank after rank
        mine = torch.empty(send.numel() // self.world_size, dtype=torch.float32, device=send.device)
        reduce_scatter_single(mine, send, op=dist.ReduceOp.SUM)
        mine /= self.world_size
        return list(mine.split([s["chunk"] for s in shards]))

    def _before_forward(self, mod, args):
        call = {"shards": self.units[mod], "full": None}
        full = FSDP._Gather.apply(self, call, *[s["param"] for s in call["shards"]])
        call["storages"] = {t.untyped_storage().data_ptr(): i for i, t in enumerate(full)}
        for s, t in zip(call["shards"], full):
            mod.__dict__[s["name"]] = t  # an instance attribute hides the registered (sharded) parameter
        saving = torch.autograd.graph.saved_tensors_hooks(functools.partial(self._pack, call),
                                                          functools.partial(self._unpack, call))
        saving.__enter__()
        self._saving[mod] = saving

    def _after_forward(self, mod, args, output):
        self._saving.pop(mod).__exit__(None, None, None)
        for s in self.units[mod]:
            del mod.__dict__[s["name"]]  # the gathered weights lose their last reference here: freed

    def _pack(self, call, t):
        """Autograd wants to keep ``t`` for the backward. If ``t`` is (a view of) one of the gathered weights
        (``call["storages"]`` maps their storages' data_ptr to their index), keep only how to find it again: its
        index, size, stride and storage offset. Anything else is kept as it is."""
        i = call["storages"].get(t.untyped_storage().data_ptr())
        if i is None:
            return t
        return (i, t.size(), t.stride(), t.storage_offset())

    def _unpack(self, call, packed):
        """The backward needs a tensor ``_pack`` kept. For a gathered weight: all-gather the module again (once per
        backward: keep the result in ``call["full"]``) and rebuild the view with ``as_strided``."""
        if isinstance(packed, torch.Tensor):
            return packed
        i, size, stride, offset = packed
        if call["full"] is None:
            call["full"] = self._gather(call["shards"])
        return call["full"][i].as_strided(size, stride, offset)

    class _Gather(torch.autograd.Function):
        """Forward: one module's all-gather. Backward (once all of its weights' gradients are in): its
        reduce-scatter, whose results become the gradients of the sharded parameters."""

        @staticmethod
        def forward(ctx, fsdp, call, *shards):
            ctx.fsdp, ctx.call = fsdp, call
            return tuple(fsdp._gather(call["shards"]))

        @staticmethod
        def backward(ctx, *grads):
            ctx.call["full"] = None  # the backward's gathered copy is freed
            return (None, None, *ctx.fsdp._reduce_scatter(ctx.call["shards"], grads))

    def finish_gradient_synchronization(self):
        """After backward, before the optimizer step: average the replicated parameters' gradients over ranks."""
        if not self.replicated:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.replicated]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        flat /= self.world_size
        for p, g in zip(self.replicated, flat.split([p.numel() for p in self.replicated])):
            p.grad = g.view_as(p).clone()

    @torch.no_grad()
    def gather_full_params(self):
        """Collective (every rank calls it): {name: full fp32 tensor} for every parameter of the wrapped module, by
        its name in ``module.named_parameters()``, for checkpoints."""
        records = {id(s["param"]): s for shards in self.units.values() for s in shards}
        full = {}
        for name, p in self.module.named_parameters():
            s = records.get(id(p))
            if s is None:
                full[name] = p.detach().clone()
                continue
            everyone = torch.empty(self.world_size * s["chunk"], dtype=p.dtype, device=p.device)
            all_gather_single(everyone, p.detach())
            full[name] = everyone[: s["numel"]].view(s["shape"]).clone()
        return full
