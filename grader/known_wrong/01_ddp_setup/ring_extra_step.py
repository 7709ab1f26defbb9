# replaces: ring_all_reduce
# loses: test_ring_all_reduce
# mistake: runs the reduce-scatter for N steps instead of N-1: the extra step re-adds a chunk that the all-gather then overwrites, so the sums come out right but every rank sends one chunk too many (2N-1 messages, not 2(N-1))
def ring_all_reduce(tensor):
    """Sum ``tensor`` over all ranks in place with a ring (reduce-scatter, then all-gather); return it."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if world == 1:
        return tensor
    right, left = (rank + 1) % world, (rank - 1) % world
    flat = tensor.view(-1)
    chunks = torch.tensor_split(flat, world)
    buffer = torch.empty_like(chunks[0])
    for step in range(world):  # one step too many
        send_c, recv_c = (rank - step) % world, (rank - step - 1) % world
        incoming = buffer[: chunks[recv_c].numel()]
        send_recv(chunks[send_c], right, incoming, left)
        chunks[recv_c].add_(incoming)
    for step in range(world - 1):
        send_c, recv_c = (rank + 1 - step) % world, (rank - step) % world
        send_recv(chunks[send_c], right, chunks[recv_c], left)
    return tensor
