"""The training program train.sbatch runs by default: Lab 01's data-parallel regression, as a torchrun worker.

Every worker (one per GPU, or one per task on CPU) trains the course's MLP (``lab_utils.labkit.models.mlp``) with
DDP on its shard of each global batch of synthetic data (``lab_utils.labkit.data.regression``: nothing is
downloaded), so the run equals one process training on the whole batch; ``--reference`` runs that single process,
without torch.distributed, for comparison. Rank 0 saves a checkpoint every ``--ckpt-every`` steps into
``$CKPT_DIR`` (train.sbatch keys it by job id), and a restarted or requeued job resumes from it with the optimizer's
state. At the end rank 0 writes ``--out`` (JSON: world size, which node and agent each rank ran on, losses, the
weights' norm, where it resumed) and prints it. ``--step-seconds`` slows each step down, to fail a node mid-run.

    torchrun --nproc-per-node=2 grader/slurm/train_lab.py --steps 50 --out result.json
    python grader/slurm/train_lab.py --reference --steps 50
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from lab_utils.labkit import data, models

IN_DIM, HIDDEN, SAMPLES = 8, 32, 4096


def batches(step: int, global_batch: int, seed: int):
    """The global batch of step ``step``: the same on every rank and in the reference."""
    x, y = data.regression(n=SAMPLES, in_dim=IN_DIM, seed=seed)
    g = torch.Generator().manual_seed(seed * 100_003 + step)
    idx = torch.randint(0, SAMPLES, (global_batch,), generator=g)
    return x[idx], y[idx]


def weight_norm(model) -> float:
    """The L2 norm of all the model's weights, in float64: equal runs end with equal weights."""
    return float(torch.sqrt(sum((p.detach().double() ** 2).sum() for p in model.parameters())))


def full_loss(model, seed: int) -> float:
    x, y = data.regression(n=SAMPLES, in_dim=IN_DIM, seed=seed)
    with torch.no_grad():
        return torch.nn.functional.mse_loss(model(x), y).item()


def reference(args) -> dict:
    """One process, the whole global batch per step: what the data-parallel run must equal."""
    model = models.mlp(IN_DIM, HIDDEN, 1, seed=args.seed)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    first = full_loss(model, args.seed)
    for step in range(args.steps):
        x, y = batches(step, args.global_batch, args.seed)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return {"world_size": 1, "steps": args.steps, "first_loss": first, "final_loss": full_loss(model, args.seed),
            "weight_norm": weight_norm(model)}


def train(args) -> dict:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", 0))
    use_cuda = torch.cuda.is_available() and local < torch.cuda.device_count()
    device = torch.device("cuda", local) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if use_cuda else "gloo")
    if args.global_batch % world:
        raise SystemExit(f"--global-batch {args.global_batch} must be a multiple of the world size {world}")
    model = models.mlp(IN_DIM, HIDDEN, 1, seed=args.seed).to(device)
    first = full_loss(model.cpu(), args.seed)
    model.to(device)
    ddp = DDP(model, device_ids=[local] if use_cuda else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)

    ckpt_dir = Path(args.ckpt_dir) if args.ckpt_dir else None
    ckpt = ckpt_dir / "checkpoint.pt" if ckpt_dir else None
    start = 0
    if ckpt is not None and ckpt.is_file():  # a restart (torchrun) or a requeue (Slurm): go on where we stopped
        state = torch.load(ckpt, map_location=device, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start = int(state["step"])
    per_rank = args.global_batch // world
    for step in range(start, args.steps):
        x, y = batches(step, args.global_batch, args.seed)
        x, y = x[rank * per_rank:(rank + 1) * per_rank].to(device), y[rank * per_rank:(rank + 1) * per_rank].to(device)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()  # DDP averages the gradients across ranks
        opt.step()
        if ckpt is not None and rank == 0 and ((step + 1) % args.ckpt_every == 0 or step + 1 == args.steps):
            ckpt_dir.mkdir(parents=True, exist_ok=True)
            tmp = ckpt.with_suffix(".tmp")
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step + 1}, tmp)
            os.replace(tmp, ckpt)  # a job killed while saving keeps the previous checkpoint whole
        if args.fail_at_step is not None and step + 1 == args.fail_at_step and start == 0 and rank == world - 1:
            raise SystemExit(f"rank {rank}: failing at step {step + 1} on purpose (--fail-at-step)")
        if args.step_seconds:
            time.sleep(args.step_seconds)
    where = [None] * world
    # an agent counts the restarts its own workers' failures caused; the others restart with it uncounted
    dist.all_gather_object(where, {"rank": rank, "host": socket.gethostname(), "device": str(device),
                                   "agent": int(os.environ.get("GROUP_RANK", 0)),
                                   "restarts": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))})
    result = {"world_size": world, "steps": args.steps, "resumed_from": start, "first_loss": first,
              "final_loss": full_loss(model.cpu(), args.seed), "weight_norm": weight_norm(model), "ranks": where,
              "job": os.environ.get("SLURM_JOB_ID")}
    dist.barrier()
    dist.destroy_process_group()
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--global-batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ckpt-dir", default=os.environ.get("CKPT_DIR"), help="default $CKPT_DIR; none: no checkpoints")
    p.add_argument("--ckpt-every", type=int, default=20)
    p.add_argument("--out", help="write the result here as JSON (rank 0)")
    p.add_argument("--reference", action="store_true", help="one process on the whole batch, no torch.distributed")
    p.add_argument("--fail-at-step", type=int, default=None, help="the last rank exits there once (to try restarts)")
    p.add_argument("--step-seconds", type=float, default=0.0,
                   help="sleep this long after each step: time to fail a node on purpose while it trains")
    args = p.parse_args(argv)
    result = reference(args) if args.reference else train(args)
    if args.reference or int(os.environ["RANK"]) == 0:
        text = json.dumps(result)
        if args.out:
            Path(args.out).write_text(text)
        print(f"result: {text}", flush=True)
    sys.stdout.flush()
    sys.stderr.flush()
    # a finished gloo worker can abort in interpreter teardown on a loaded machine (ARCHITECTURE.md §7)
    os._exit(0)


if __name__ == "__main__":
    main()
