# replaces: checkpoint_io
# loses: test_checkpoint_io
# mistake: torch.save straight over the checkpoint: a crash during the save leaves a truncated, unloadable file
def save_checkpoint(state, path, rank):
    """Rank 0 writes `state` to `path` atomically (temp file in the same folder + os.replace); others skip."""
    if rank != 0:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    torch.save(state, path)


def load_checkpoint(path):
    """The checkpoint saved at `path`, or None if there is none yet."""
    if not os.path.exists(path):
        return None
    return torch.load(path, map_location="cpu")
