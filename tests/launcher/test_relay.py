"""lab_utils.launcher.relay: with launch(..., traffic=Traffic()) every message the ranks send is counted in this
process, the results are what gloo would give, and what a rank sends cannot make the relay misbehave."""
from __future__ import annotations

import json
import struct

import pytest
import torch

from lab_utils import RankFailedError, Traffic, launch, sockets
from lab_utils.launcher import wire
from lab_utils.launcher.relay import RelayError, collectives


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


@pytest.mark.parametrize("part", ["header", "payload"])
def test_a_frame_declared_over_the_limit_is_refused_before_it_is_read(tmp_path, part):
    traffic = Traffic()
    r = traffic.start(1, directory=str(tmp_path))
    try:
        s = sockets.connect_unix(r.address)  # as a rank does: pytest's tmp_path may be longer than an address holds
        wire.send_message(s, {"op": "hello", "rank": 0})
        head = json.dumps({"id": 1, "op": "allreduce", "group": [0], "seq": 1, "dtype": "uint8", "shape": [1]}).encode()
        if part == "header":
            s.sendall(struct.pack("!Q", 1_500_000_000))  # 1.4 GB of header declared, never sent
        else:
            s.sendall(struct.pack("!Q", len(head)) + head + struct.pack("!Q", 1_500_000_000))
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
        first = sockets.connect_unix(r.address)
        wire.send_message(first, {"op": "hello", "rank": 0})
        first.settimeout(10)
        wire.send_message(first, {"id": 1, "op": "barrier", "group": [0], "seq": 1})
        assert wire.recv_message(first)[0] == {"id": 1, "error": None}
        second = sockets.connect_unix(r.address)
        second.settimeout(10)
        try:
            wire.send_message(second, {"op": "hello", "rank": 0})
            wire.send_message(second, {"id": 2, "op": "barrier", "group": [0], "seq": 2})
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
        s = sockets.connect_unix(r.address)  # as a rank does: pytest's tmp_path may be longer than an address holds
        s.settimeout(10)
        wire.send_message(s, {"op": "hello", "rank": 0})
        wire.send_message(s, {"id": 1, "op": "send", "group": [0, 1], "peer": 5, "dtype": "float32",
                              "shape": [1]}, b"\0" * 4)
        assert "not in its group" in wire.recv_message(s)[0]["error"]
        wire.send_message(s, {"id": 2, "op": "send", "group": [0, 1], "peer": 0, "dtype": "float32",
                              "shape": [1]}, b"\0" * 4)
        assert "itself" in wire.recv_message(s)[0]["error"]
        wire.send_message(s, {"id": 3, "op": "recv", "group": [0, 1], "peer": "x", "nbytes": 4})
        assert "malformed" in wire.recv_message(s)[0]["error"]
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


# ------------------------------------------------------------------------------------------------ the arithmetic,
# on bytes: what the relay answers each member of a collective, with no socket and no rank
def _f32(*xs) -> bytes:
    return struct.pack(f"={len(xs)}f", *xs)


def _i64(*xs) -> bytes:
    return struct.pack(f"={len(xs)}q", *xs)


def _ins(op, group, payloads, **fields):
    """{global rank: (header, payload)} as the ranks of ``group`` send them, each with the same fields."""
    dtype = fields.pop("dtype", "float32")
    size = 8 if dtype == "int64" else 4
    return {g: ({"op": op, "seq": 1, "dtype": dtype, "shape": [len(p) // size], **fields}, p)
            for g, p in zip(group, payloads)}


@pytest.mark.parametrize("how, want", [("SUM", (9.0, 12.0)), ("AVG", (3.0, 4.0)), ("PRODUCT", (15.0, 48.0)),
                                       ("MAX", (5.0, 6.0)), ("MIN", (1.0, 2.0))])
def test_all_reduce_gives_every_member_the_reduction(how, want):
    group = (0, 1, 2)
    out = collectives.combine(group, _ins("allreduce", group, [_f32(1, 2), _f32(3, 4), _f32(5, 6)], reduce=how))
    assert out == {g: _f32(*want) for g in group}


def test_an_integer_average_is_floored_and_keeps_its_dtype():
    group = (0, 1)
    out = collectives.combine(group, _ins("allreduce", group, [_i64(1, -3), _i64(2, 0)], reduce="AVG", dtype="int64"))
    assert out == {0: _i64(1, -2), 1: _i64(1, -2)}


def test_a_rooted_collective_names_its_root_by_group_position_and_answers_it_alone():
    group = (2, 5)  # a subgroup: root 1 is global rank 5
    out = collectives.combine(group, _ins("reduce", group, [_f32(1), _f32(2)], reduce="SUM", root=1))
    assert out == {2: b"", 5: _f32(3)}
    out = collectives.combine(group, _ins("broadcast", group, [_f32(7), _f32(8)], root=1))
    assert out == {2: _f32(8), 5: _f32(8)}
    out = collectives.combine(group, _ins("gather", group, [_f32(7), _f32(8)], root=0))
    assert out == {2: _f32(7, 8), 5: b""}


def test_gathers_and_scatters_go_in_group_order():
    group = (3, 1, 0)  # group order, not rank order
    ins = _ins("allgather", group, [_f32(30), _f32(10), _f32(0)])
    assert collectives.combine(group, dict(reversed(ins.items()))) == {g: _f32(30, 10, 0) for g in group}
    ins = _ins("reduce_scatter", group, [_f32(1, 2, 3), _f32(10, 20, 30), _f32(100, 200, 300)], reduce="SUM")
    assert collectives.combine(group, ins) == {3: _f32(111), 1: _f32(222), 0: _f32(333)}
    ins = _ins("scatter", group, [b"", _f32(4, 5, 6), b""], root=1)
    assert collectives.combine(group, ins) == {3: _f32(4), 1: _f32(5), 0: _f32(6)}


def test_all_to_all_sends_each_member_its_chunk_of_every_input_uneven_splits_included():
    group = (0, 1)
    ins = {0: ({"op": "alltoall", "seq": 1, "splits": [4, 8]}, _f32(1, 2, 3)),
           1: ({"op": "alltoall", "seq": 1, "splits": [8, 4]}, _f32(4, 5, 6))}
    assert collectives.combine(group, ins) == {0: _f32(1, 4, 5), 1: _f32(2, 3, 6)}


def test_a_barrier_answers_every_member_with_nothing():
    assert collectives.combine((0, 1), {0: ({"op": "barrier"}, b""), 1: ({"op": "barrier"}, b"")}) == {0: b"", 1: b""}


def test_members_that_disagree_are_named():
    group = (0, 1)
    ins = _ins("allreduce", group, [_f32(1), _f32(1)])
    ins[1] = ({**ins[1][0], "op": "broadcast"}, ins[1][1])
    with pytest.raises(RelayError, match="mismatched collectives.*rank 0 in allreduce, rank 1 in broadcast"):
        collectives.combine(group, ins)
    with pytest.raises(RelayError, match=r"needs the same tensor on every rank.*rank 0: float32 \(1,\), "
                                         r"rank 1: float32 \(2,\)"):
        collectives.combine(group, _ins("allreduce", group, [_f32(1), _f32(1, 2)]))
    with pytest.raises(RelayError, match="reduce op BAND is not supported"):
        collectives.combine(group, _ins("allreduce", group, [_f32(1), _f32(1)], reduce="BAND"))


def test_bytes_that_do_not_hold_the_declared_tensor_are_refused():
    with pytest.raises(RelayError, match="5 bytes do not hold a float32 tensor of shape"):
        collectives.tensor(b"\0" * 5, "float32", [1])
    with pytest.raises(RelayError, match="dtype object"):
        collectives.tensor(b"", "object", [0])
    t = torch.arange(6, dtype=torch.int16).reshape(2, 3)
    assert torch.equal(collectives.tensor(collectives.tensor_bytes(t.t()), "int16", [3, 2]), t.t())


def test_a_frame_becomes_a_checked_call():
    head = {"op": "broadcast", "group": [4, 6], "root": 1, "dtype": "float32", "shape": [2], "seq": 3}
    call = collectives.describe(4, head, _f32(1, 2), keep_data=True)
    assert (call.rank, call.op, call.group, call.peer, call.nbytes, call.shape, call.data) == \
        (4, "broadcast", (4, 6), 6, 8, (2,), _f32(1, 2))
    recv = collectives.describe(4, {"op": "recv", "group": [4, 6], "peer": 6, "nbytes": 8}, b"", keep_data=True)
    assert recv.nbytes == 8 and recv.data == b""
    for head, said in [({"op": "pickle"}, "unknown relay call"),
                       ({"op": "barrier", "group": [1, 2]}, "a group it is not in"),
                       ({"op": "send", "group": [4, 6], "peer": 5}, "not in its group"),
                       ({"op": "send", "group": [4, 6], "peer": 4}, "itself as the peer"),
                       ({"op": "recv", "group": [4, 6], "peer": "x"}, "malformed")]:
        with pytest.raises(RelayError, match=said):
            collectives.describe(4, head, b"")
