# replaces: ring_all_reduce
# loses: test_ring_all_reduce
# mistake: cuts the tensor into chunks of numel // world_size elements, so the leftover elements (7 elements on 2 ranks) and every element of a tensor smaller than the world size are never reduced
def ring_all_reduce(tensor):
    """Sum ``tensor`` over all ranks in place with a ring (reduce-scatter, then all-gather); return it."""
    rank, world = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % world, (rank - 1) % world
    flat = tensor.view(-1)
    size = flat.numel() // world
    chunks = [flat[i * size:(i + 1) * size] for i in range(world)]
    buffer = torch.empty_like(chunks[0])
    for step in range(world - 1):
        send_c, recv_c = (rank - step) % world, (rank - step - 1) % world
        send_recv(chunks[send_c], right, buffer, left)
        chunks[recv_c].add_(buffer)
    for step in range(world - 1):
        send_c, recv_c = (rank + 1 - step) % world, (rank - step) % world
        send_recv(chunks[send_c], right, chunks[recv_c], left)
    return tensor
