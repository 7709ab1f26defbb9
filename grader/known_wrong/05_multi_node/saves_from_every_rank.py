# replaces: checkpoint_io
# loses: test_checkpoint_io
# mistake: every rank writes the checkpoint (atomically, but N writers race for one file on a shared disk)
def save_checkpoint(state, path, rank):
    """Rank 0 writes `state` to `path` atomically (temp file in the same folder + os.replace); others skip."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def load_checkpoint(path):
    """The checkpoint saved at `path`, or None if there is none yet."""
    if not os.path.exists(path):
        return None
    return torch.load(path, map_location="cpu")
