"""Plain data across the student/grader boundary: encoded where student code ran, decoded without trusting it.

The grader never unpickles bytes that student code could have shaped with plain ``pickle`` (one
``__reduce__`` away from running code in the grader). Answers holding tensors are encoded with ``torch.save``
and decoded with ``torch.load(weights_only=True)``, torch's restricted unpickler, which rebuilds only tensors,
numbers, strings, bytes, ``None`` and lists/tuples/dicts/sets of them. Answers without tensors (most messages)
use a pickle that the grader reads with an unpickler that resolves no global at all but ``complex``, so
neither side has to import torch to talk. Numpy values are
converted to tagged tensors on the way out and back to numpy on the way in, so a student's ``np.float64``
answer arrives as a number and an ``ndarray`` as an ``ndarray``.
"""
from __future__ import annotations

import io
import pickle
import sys

MAX_BYTES = 256 << 20  # an answer larger than this is refused before it is read (``wire.read_frame``)
_ND = "__dtlabs_ndarray__"


class NotPlainData(TypeError):
    """A value that cannot cross to the grader: say what it was and what to return instead."""


def _to_plain(obj, path="result", depth=0):
    if depth > 50:
        raise NotPlainData(f"{path} is nested more than 50 levels deep")
    if obj is None:
        return obj
    for base in (bool, int, float, complex, str, bytes):  # subclasses (np.float64, IntEnum) become the base type
        if isinstance(obj, base):
            return obj if type(obj) is base else base(obj)
    torch = sys.modules.get("torch")  # a tensor can only exist if torch was imported
    if torch is not None and isinstance(obj, torch.Tensor):
        t = obj.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        if t.is_quantized or t.layout != torch.strided:
            raise NotPlainData(f"{path} is a {t.layout} / quantized tensor: return a plain dense tensor")
        return t.clone() if type(obj) is not torch.Tensor else t  # Parameter -> Tensor
    if torch is not None and isinstance(obj, (torch.dtype, torch.device, torch.Size)):
        return obj
    np = sys.modules.get("numpy")
    if np is not None:
        if isinstance(obj, np.generic):
            return obj.item()
        if isinstance(obj, np.ndarray):
            if obj.dtype.kind not in "biufc":
                raise NotPlainData(f"{path} is a numpy array of {obj.dtype}: only numeric arrays cross")
            import torch

            return {_ND: torch.from_numpy(np.ascontiguousarray(obj).copy())}
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if not isinstance(k, (str, int, float, bool, tuple)) or k is None:
                raise NotPlainData(f"{path} has a key of type {type(k).__name__}: use str/int keys")
            out[k] = _to_plain(v, f"{path}[{k!r}]", depth + 1)
        return out
    if isinstance(obj, (list, tuple, set, frozenset)):
        items = [_to_plain(v, f"{path}[{i}]", depth + 1) for i, v in enumerate(obj)]
        if isinstance(obj, list):
            return items
        if isinstance(obj, (set, frozenset)):
            return set(items)
        return tuple(items)  # named tuples arrive as plain tuples
    raise NotPlainData(
        f"{path} is a {type(obj).__module__}.{type(obj).__qualname__}, which the grader cannot accept: return "
        "tensors, numbers, strings, or lists/tuples/dicts of them (e.g. a state_dict, .item(), .tolist())"
    )


def _has_torch(obj) -> bool:
    if isinstance(obj, dict):
        return any(_has_torch(v) for v in obj.values())
    if isinstance(obj, (list, tuple, set)):
        return any(_has_torch(v) for v in obj)
    return type(obj).__module__.startswith("torch")


def encode(obj) -> bytes:
    """Bytes for ``obj`` (raises ``NotPlainData`` naming the offending part). Runs on the student's side."""
    plain = _to_plain(obj)
    if not _has_torch(plain):
        return b"P" + pickle.dumps(plain, protocol=4)
    import torch

    buf = io.BytesIO()
    torch.save(plain, buf)
    return b"T" + buf.getvalue()


class _NoGlobals(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) == ("builtins", "complex"):
            return complex
        raise pickle.UnpicklingError(f"refused to load {module}.{name}: only plain data crosses to the grader")


def _from_plain(obj):
    if isinstance(obj, dict):
        if len(obj) == 1 and _ND in obj:
            return obj[_ND].numpy()
        return {k: _from_plain(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_from_plain(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_from_plain(v) for v in obj)
    if isinstance(obj, set):
        return {_from_plain(v) for v in obj}
    return obj


def decode(data: bytes):
    """The value ``encode`` made, rebuilt without running anything it names. Grader side."""
    if len(data) > MAX_BYTES:
        raise NotPlainData(f"an answer over the {MAX_BYTES}-byte limit")
    kind, body = data[:1], data[1:]
    if kind == b"P":
        return _NoGlobals(io.BytesIO(body)).load()
    if kind != b"T":
        raise NotPlainData("not an answer made by lab_utils.launcher.plaindata.encode")
    import warnings

    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a warning here would print to stderr and fail the cell
        return _from_plain(torch.load(io.BytesIO(body), weights_only=True, map_location="cpu"))
