"""lab_utils.launcher.relay: with launch(..., traffic=Traffic()) every message the ranks send is counted in this
process, the results are what gloo would give, and what a rank sends cannot make the relay misbehave."""
from __future__ import annotations

import struct

import pytest
import torch

from lab_utils import RankFailedError, Traffic, launch
from lab_utils.launcher import relay, wire


def _ring_pair():
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    x = torch.full((4,), float(rank))
    y = torch.empty(4)
    req = dist.isend(x, (rank + 1) % world)
    dist.recv(y, (rank - 1) % world)
    req.wait()
    t = torch.ones(3) * (rank + 1)
    dist.all_reduce(t)
    b = torch.tensor([float(rank)])
    dist.broadcast(b, src=world - 1)
    out = [torch.zeros(2) for _ in range(world)]
    dist.all_gather(out, torch.full((2,), float(rank)))
    sub = dist.new_group([0, 1])
    s = torch.ones(1) * rank
    if rank in (0, 1):
        dist.all_reduce(s, group=sub)
    dist.barrier()
    return {"recv": y, "sum": t, "bcast": b, "gather": torch.stack(out), "sub": s}


def test_every_call_is_counted_in_the_launching_process_and_results_are_right():
    traffic = Traffic(keep_data=True)
    res = launch(_ring_pair, world_size=3, timeout=60, quiet=True, traffic=traffic)
    for r, out in enumerate(res):
        assert torch.equal(out["recv"], torch.full((4,), float((r - 1) % 3)))
        assert torch.equal(out["sum"], torch.full((3,), 6.0))
        assert torch.equal(out["bcast"], torch.tensor([2.0]))
        assert torch.equal(out["gather"], torch.tensor([[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]]))
    assert [res[r]["sub"].item() for r in range(3)] == [1.0, 1.0, 2.0]
    for r in range(3):
        assert traffic.count("send", rank=r) == 1 and traffic.bytes("send", rank=r) == 16
        assert traffic.select("send", rank=r)[0].peer == (r + 1) % 3
        assert traffic.count("recv", rank=r) == 1
        assert traffic.count("allreduce", rank=r) == (2 if r < 2 else 1)
        assert traffic.count("broadcast", rank=r) == 1 and traffic.select("broadcast", rank=r)[0].peer == 2
    assert traffic.count("allreduce", group=(0, 1)) == 2
    assert torch.equal(traffic.tensor(traffic.select("send", rank=1)[0]), torch.ones(4))


def _ddp_steps(no_sync):
    import contextlib

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(dist.get_rank())
    for _ in range(3):
        for micro in range(2):
            with model.no_sync() if no_sync and micro == 0 else contextlib.nullcontext():
                model(torch.randn(5, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


def test_ddp_runs_on_the_relay_and_no_sync_shows_in_the_count():
    counts = {}
    for no_sync in (False, True):
        traffic = Traffic()
        res = launch(_ddp_steps, world_size=2, timeout=60, quiet=True, args=(no_sync,), traffic=traffic)
        assert all(torch.equal(a, b) for a, b in zip(res[0], res[1])), "the replicas differ"
        counts[no_sync] = traffic.count("allreduce", rank=0)
    # one bucket: one all-reduce per synchronised backward (3 steps of 2 backwards; no_sync keeps the first of each)
    assert counts[False] == 6 and counts[True] == 3, counts


def _mismatch():
    import torch
    import torch.distributed as dist

    t = torch.ones(2)
    if dist.get_rank() == 0:
        dist.all_reduce(t)
    else:
        dist.broadcast(t, src=0)


def test_mismatched_collectives_are_named_at_once():
    with pytest.raises(RankFailedError, match="mismatched collectives.*rank 0 in allreduce, rank 1 in broadcast"):
        launch(_mismatch, world_size=2, timeout=30, quiet=True, traffic=Traffic())


def _wrong_size():
    import torch
    import torch.distributed as dist

    if dist.get_rank() == 0:
        dist.send(torch.ones(3), 1)
    else:
        dist.recv(torch.empty(2), 0)


def test_a_recv_of_the_wrong_size_is_named():
    with pytest.raises(RankFailedError, match="recv for 8 bytes from rank 0, which sent 12 bytes"):
        launch(_wrong_size, world_size=2, timeout=30, quiet=True, traffic=Traffic())


def test_a_frame_declared_over_the_limit_is_refused_before_it_is_read(tmp_path):
    traffic = Traffic()
    r = traffic.start(1, directory=str(tmp_path))
    try:
        s = wire.connect_unix(r.address)  # as a rank does: pytest's tmp_path may be longer than an address holds
        relay._send(s, {"op": "hello", "rank": 0})
        s.sendall(struct.pack("!II", 10, 1_500_000_000))  # 1.4 GB declared, never sent
        s.settimeout(10)
        assert s.recv(1) == b"", "the relay should hang up on a frame over its limit"
    finally:
        r.stop()
    assert traffic.calls == []


def _fifo_and_order(n):
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    if rank == 0:  # n isends to one peer, back to back, then a recv: the relay must keep both their order and ours
        reqs = [dist.isend(torch.full((3,), float(i)), 1) for i in range(n)]
        got = torch.empty(1)
        dist.recv(got, 1)
        for r in reqs:
            r.wait()
        return got
    early = torch.ones(1)
    dist.send(early, 0)  # rank 1 sends first: rank 0's recv is answered at once, yet it comes after rank 0's isends
    outs = [torch.empty(3) for _ in range(n)]
    reqs = [dist.irecv(o, 0) for o in outs]
    for r in reqs:
        r.wait()
    return [o[0].item() for o in outs]


def test_messages_between_two_ranks_keep_their_order_and_calls_are_recorded_in_the_rank_s_order():
    traffic = Traffic(keep_data=True)
    res = launch(_fifo_and_order, world_size=2, timeout=60, quiet=True, args=(60,), traffic=traffic)
    assert res[1] == [float(i) for i in range(60)], "two isends to one peer overtook each other"
    assert [c.op for c in traffic.select(rank=0)] == ["send"] * 60 + ["recv"]
    assert [traffic.tensor(c)[0].item() for c in traffic.select("send", rank=0)] == [float(i) for i in range(60)]
    assert [c.op for c in traffic.select(rank=1)] == ["send"] + ["recv"] * 60


def _collective_inputs():
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    t = torch.full((2,), float(rank + 1))
    dist.all_reduce(t)
    out = [torch.empty(1, dtype=torch.int32) for _ in range(2)]
    dist.all_gather(out, torch.tensor([10 * rank], dtype=torch.int32))
    return t


def test_keep_data_keeps_what_each_rank_handed_to_a_collective():
    traffic = Traffic(keep_data=True)
    res = launch(_collective_inputs, world_size=2, timeout=60, quiet=True, traffic=traffic)
    assert all(torch.equal(r, torch.full((2,), 3.0)) for r in res)
    for r in range(2):
        (reduce_call,) = traffic.select("allreduce", rank=r)
        assert torch.equal(traffic.tensor(reduce_call), torch.full((2,), float(r + 1)))
        (gather_call,) = traffic.select("allgather", rank=r)
        assert gather_call.nbytes == 4 and torch.equal(traffic.tensor(gather_call), torch.tensor([10 * r], dtype=torch.int32))


def test_a_second_connection_in_a_joined_rank_s_name_is_refused(tmp_path):
    traffic = Traffic()
    r = traffic.start(1, directory=str(tmp_path))
    try:
        first = wire.connect_unix(r.address)
        relay._send(first, {"op": "hello", "rank": 0})
        first.settimeout(10)
        relay._send(first, {"id": 1, "op": "barrier", "group": [0], "seq": 1})
        assert relay._recv(first)[0] == {"id": 1, "error": None}
        second = wire.connect_unix(r.address)
        second.settimeout(10)
        try:
            relay._send(second, {"op": "hello", "rank": 0})
            relay._send(second, {"id": 2, "op": "barrier", "group": [0], "seq": 2})
            hung_up = second.recv(1) == b""
        except (BrokenPipeError, ConnectionResetError):  # closed already, or with our call unread
            hung_up = True
        assert hung_up, "a call made in the name of a rank that already joined must be refused"
    finally:
        r.stop()
    assert [c.op for c in traffic.calls] == ["barrier"]


def test_a_send_outside_the_group_or_to_oneself_is_named(tmp_path):
    traffic = Traffic()
    r = traffic.start(2, directory=str(tmp_path))
    try:
        s = wire.connect_unix(r.address)  # as a rank does: pytest's tmp_path may be longer than an address holds
        s.settimeout(10)
        relay._send(s, {"op": "hello", "rank": 0})
        relay._send(s, {"id": 1, "op": "send", "group": [0, 1], "peer": 5, "dtype": "float32", "shape": [1]}, b"\0" * 4)
        assert "not in its group" in relay._recv(s)[0]["error"]
        relay._send(s, {"id": 2, "op": "send", "group": [0, 1], "peer": 0, "dtype": "float32", "shape": [1]}, b"\0" * 4)
        assert "itself" in relay._recv(s)[0]["error"]
        relay._send(s, {"id": 3, "op": "recv", "group": [0, 1], "peer": "x", "nbytes": 4})
        assert "malformed" in relay._recv(s)[0]["error"]
    finally:
        r.stop()
    assert traffic.calls == []


def _callback_waits_for_another_call():
    import torch
    import torch.distributed as dist

    first = torch.ones(2)

    def then(fut):  # a callback that waits for a second collective, as PowerSGD's hook does
        second = fut.value()[0] * 2
        dist.all_reduce(second, async_op=True).get_future().wait()
        return second

    return dist.all_reduce(first, async_op=True).get_future().then(then).wait()


def test_a_future_callback_may_wait_for_another_call():
    res = launch(_callback_waits_for_another_call, world_size=2, timeout=30, quiet=True, traffic=Traffic())
    assert all(torch.equal(r, torch.full((2,), 8.0)) for r in res)


def _powersgd_steps():
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(8, 4, bias=False))
    model.register_comm_hook(powerSGD.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                                    start_powerSGD_iter=2), powerSGD.powerSGD_hook)
    torch.manual_seed(dist.get_rank())
    for _ in range(4):
        model(torch.randn(5, 8)).sum().backward()
    return model.module.weight.grad


def test_ddp_with_the_powersgd_hook_runs_on_the_relay():
    traffic = Traffic()
    res = launch(_powersgd_steps, world_size=2, timeout=60, quiet=True, traffic=traffic)
    assert torch.equal(res[0], res[1])
    # two plain all-reduces, then in each compressed step the (empty) uncompressed rest, P and Q
    assert traffic.count("allreduce", rank=0) == 2 + 3 * 2, [c.op for c in traffic.select(rank=0)]


def _broadcast_parameters():
    import torch
    import torch.distributed as dist

    torch.manual_seed(dist.get_rank())
    layer = torch.nn.Linear(3, 2)
    with torch.no_grad():  # as a data-parallel wrapper starts: rank 0's weights everywhere (leaves that require grad)
        for p in layer.parameters():
            dist.broadcast(p, src=0)
    return [p.detach().clone() for p in layer.parameters()]


def test_a_parameter_can_be_received_into():
    res = launch(_broadcast_parameters, world_size=2, timeout=30, quiet=True, traffic=Traffic())
    torch.manual_seed(0)
    want = [p.detach() for p in torch.nn.Linear(3, 2).parameters()]
    assert all(torch.equal(a, b) for r in res for a, b in zip(r, want))


def _into_tensor_ops():
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    gathered = torch.empty(2 * world)
    dist.all_gather_into_tensor(gathered, torch.full((2,), float(rank)))
    scattered = torch.empty(2)
    dist.reduce_scatter_tensor(scattered, torch.arange(2.0 * world) + rank)
    return gathered, scattered


def test_all_gather_into_tensor_and_reduce_scatter_tensor():
    # torch 2.13 routes both through the group's all_gather_single / reduce_scatter_single
    traffic = Traffic()
    res = launch(_into_tensor_ops, world_size=2, timeout=30, quiet=True, traffic=traffic)
    for r, (gathered, scattered) in enumerate(res):
        assert torch.equal(gathered, torch.tensor([0.0, 0.0, 1.0, 1.0]))
        assert torch.equal(scattered, torch.tensor([1.0, 3.0]) + 4 * r)
    assert traffic.count("allgather", rank=0) == 1 and traffic.count("reduce_scatter", rank=0) == 1


def _fsdp_step():
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    fully_shard(model[0])
    fully_shard(model)
    torch.manual_seed(1)
    x = torch.randn(4, 6)[dist.get_rank()::2]
    dist.barrier()
    model(x).pow(2).sum().backward()
    dist.barrier()
    return [p.grad.full_tensor() for p in model.parameters()]


def test_fsdp2_runs_on_the_relay_one_all_gather_per_unit():
    traffic = Traffic()
    res = launch(_fsdp_step, world_size=2, timeout=60, quiet=True, traffic=traffic)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    torch.manual_seed(1)
    model(torch.randn(4, 6)).pow(2).sum().backward()
    for r in range(2):  # FSDP averages over ranks: the sum over the whole batch, divided by 2
        assert all(torch.allclose(g, p.grad / 2, atol=1e-6) for g, p in zip(res[r], model.parameters()))
    calls = traffic.select(rank=0)
    cuts = [i for i, c in enumerate(calls) if c.op == "barrier"]
    step = [c.op for c in calls[cuts[0] + 1:cuts[1]]]
    assert step.count("allgather") >= 2 and step.count("reduce_scatter") == 2, step  # two units: the root, model[0]
