# attack: a trace function that skips every `assert`/`raise` line of later code
# defended-by: split
import sys


def _skip(frame, event, arg):
    if event == "exception":
        frame.f_locals.clear()
    return _skip


sys.settrace(_skip)
