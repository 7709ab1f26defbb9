# attack: take the grading machine's memory
# defended-by: limits
_hog = []
for _ in range(64):
    _hog.append(b"\x01" * (256 << 20))
