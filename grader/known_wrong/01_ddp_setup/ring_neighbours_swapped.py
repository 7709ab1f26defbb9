# replaces: ring_all_reduce
# loses: test_ring_all_reduce
# mistake: left and right neighbours swapped (sends to rank - 1, receives from rank + 1): on 2 ranks left = right and every check passes; on 3 ranks the chunks arrive at the wrong ranks (wrong sums, or mismatched message sizes that abort gloo)
def ring_all_reduce(tensor):
    """Sum ``tensor`` over all ranks in place with a ring (reduce-scatter, then all-gather); return it."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if world == 1:
        return tensor
    right, left = (rank - 1) % world, (rank + 1) % world  # swapped
    flat = tensor.view(-1)
    chunks = torch.tensor_split(flat, world)
    buffer = torch.empty_like(chunks[0])
    for step in range(world - 1):
        send_c, recv_c = (rank - step) % world, (rank - step - 1) % world
        incoming = buffer[: chunks[recv_c].numel()]
        send_recv(chunks[send_c], right, incoming, left)
        chunks[recv_c].add_(incoming)
    for step in range(world - 1):
        send_c, recv_c = (rank + 1 - step) % world, (rank - step) % world
        send_recv(chunks[send_c], right, chunks[recv_c], left)
    return tensor
