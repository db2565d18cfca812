"""Describing and checking values against ONNX ``TypeProto``s: ``NodeArg`` and feed checks."""

from __future__ import annotations

from typing import Any

import numpy as np
from onnx import TensorProto, TypeProto

from ..dtypes import elem_type_name, np_dtype
from ..errors import InvalidArgument

__all__ = ["NodeArg", "type_to_string", "shape_of", "FeedChecker", "MapKeyTypeError"]


def type_to_string(tp: TypeProto | None) -> str:
    """onnxruntime's type string: ``tensor(float)``, ``seq(tensor(int64))``, ``map(string,tensor(float))``."""
    if tp is None:
        return "unknown"
    which = tp.WhichOneof("value")
    if which == "tensor_type":
        return f"tensor({elem_type_name(tp.tensor_type.elem_type)})" if tp.tensor_type.elem_type else "tensor(undefined)"
    if which == "sequence_type":
        return f"seq({type_to_string(tp.sequence_type.elem_type)})"
    if which == "map_type":
        return f"map({elem_type_name(tp.map_type.key_type)},{type_to_string(tp.map_type.value_type)})"
    if which == "optional_type":
        return f"optional({type_to_string(tp.optional_type.elem_type)})"
    if which == "sparse_tensor_type":
        return f"sparse_tensor({elem_type_name(tp.sparse_tensor_type.elem_type)})"
    return "unknown"


def shape_of(tp: TypeProto | None) -> list[int | str | None] | None:
    """The declared shape: ints, symbolic names, or ``None`` for unknown dimensions.

    A negative ``dim_value`` (exporters write ``-1`` for a free batch dimension) is
    unknown, as onnxruntime reads it: it is ``None`` here, so it matches any size and
    ``NodeArg.shape`` reports it as onnxruntime does. A zero ``dim_value`` is a fixed
    size like any other (only an empty dimension matches it), as in onnxruntime."""
    if tp is None:
        return None
    which = tp.WhichOneof("value")
    if which == "tensor_type":
        tt = tp.tensor_type
    elif which == "sparse_tensor_type":
        tt = tp.sparse_tensor_type
    else:
        return []
    if not tt.HasField("shape"):
        return None
    out: list[int | str | None] = []
    for d in tt.shape.dim:
        if d.HasField("dim_value"):
            out.append(int(d.dim_value) if d.dim_value >= 0 else None)
        elif d.HasField("dim_param"):
            out.append(d.dim_param)
        else:
            out.append(None)
    return out


# dim_params that exporters write for "unknown", not a name shared between axes:
# paddle2onnx declares [-1, 3, '?', '?'] for an image of any height and width
_ANONYMOUS_DIMS = frozenset({"?"})


class MapKeyTypeError(InvalidArgument, RuntimeError):
    """A map feed's key of the wrong type: an ``InvalidArgument`` and, as onnxruntime raises
    it (with the same wording), a ``RuntimeError``."""


#: onnxruntime's C names of map key types, which its message about a wrong key names
_C_KEY_TYPES = {TensorProto.INT64: "int64_t", TensorProto.STRING: "std::string"}


class NodeArg:
    """A graph input or output as onnxruntime describes it: ``name``, ``type``, ``shape``."""

    def __init__(self, name: str, tp: TypeProto | None):
        self.name = name
        self.type = type_to_string(tp)
        self.shape = shape_of(tp)
        self._tp = tp

    def __repr__(self) -> str:
        return f"NodeArg(name={self.name!r}, type={self.type!r}, shape={self.shape!r})"


class FeedChecker:
    """Validates a feed against the graph's declared input types, with precise errors."""

    def __init__(self, inputs: list[tuple[str, TypeProto | None]], required: set[str]):
        self.inputs = dict(inputs)
        self.order = [n for n, _ in inputs]
        self.required = required
        self._dtypes: dict[str, np.dtype | None] = {}
        self._shapes: dict[str, list | None] = {}
        for name, tp in inputs:
            if tp is not None and tp.WhichOneof("value") == "tensor_type" and tp.tensor_type.elem_type:
                try:
                    self._dtypes[name] = np_dtype(tp.tensor_type.elem_type)
                except TypeError:
                    self._dtypes[name] = None
            else:
                self._dtypes[name] = None
            self._shapes[name] = shape_of(tp) if tp is not None and tp.WhichOneof("value") == "tensor_type" else None
        # the common feed, checked in a few comparisons: every required input and nothing
        # else, each a plain ndarray of its dtype (fixed shapes compared as tuples); any
        # other feed takes the full check, which also words the errors
        self._fast: tuple | None = None
        fast = []
        for name in self.order:
            if name not in required:
                continue
            want = self._dtypes.get(name)
            if want is None or want.kind == "O":
                fast = None
                break
            shape = self._shapes.get(name)
            if shape is None:
                fast.append((name, want, None, None))
            elif all(isinstance(d, int) for d in shape):
                fast.append((name, want, tuple(shape), None))
            else:
                # (rank, fixed (axis, size) pairs, named (axis, name) pairs)
                sizes = tuple((a, d) for a, d in enumerate(shape) if isinstance(d, int))
                named = tuple((a, d) for a, d in enumerate(shape)
                              if isinstance(d, str) and d and d not in _ANONYMOUS_DIMS)
                fast.append((name, want, None, (len(shape), sizes, named)))
        if fast is not None:
            self._fast = (frozenset(n for n, _, _, _ in fast), tuple(fast))

    def check_fast(self, feeds: Any) -> dict[str, Any] | None:
        """``feeds`` itself when it is the common feed that :meth:`check` would return
        unchanged (each required input, nothing else, each a plain ndarray of its declared
        dtype and of its fixed declared shape); None for any other feed, which then takes
        :meth:`check`. Inputs with symbolic or unknown dimensions are checked as there."""
        fast = self._fast
        if fast is None or type(feeds) is not dict or feeds.keys() != fast[0]:
            return None
        bound: dict[str, int] | None = None
        for name, want, fixed, free in fast[1]:
            v = feeds[name]
            if type(v) is not np.ndarray or v.dtype != want:
                return None
            if fixed is not None:
                if v.shape != fixed:
                    return None
            elif free is not None:
                shape = v.shape
                rank, sizes, named = free
                if len(shape) != rank:
                    return None
                for a, d in sizes:
                    if shape[a] != d:
                        return None
                for a, dim in named:
                    if bound is None:
                        bound = {}
                    if bound.setdefault(dim, shape[a]) != shape[a]:
                        return None  # the full check words it, naming inputs in the feed's order
        return feeds

    def check(self, feeds: dict[str, Any]) -> dict[str, Any]:
        """Return the feed with values normalized (e.g. strings to object arrays)."""
        if not isinstance(feeds, dict):
            raise InvalidArgument(f"input_feed must be a dict of name -> value, not {type(feeds).__name__}")
        for name in feeds:
            if name not in self.inputs:
                expected = ", ".join(self.order) or "none"
                raise InvalidArgument(f"unknown input {name!r}; the model's inputs are: {expected}")
        missing = [n for n in self.order if n in self.required and n not in feeds]
        if missing:
            raise InvalidArgument(
                f"missing input{'s' if len(missing) > 1 else ''} {', '.join(repr(m) for m in missing)}; "
                f"the model needs: {', '.join(sorted(self.required, key=self.order.index))} "
                f"(Required inputs ({missing}) are missing from input feed ({list(feeds)}))"
            )
        out = {}
        bound: dict[str, tuple[int, str]] = {}
        for name, value in feeds.items():
            out[name] = self._check_one(name, value, bound)
        return out

    def _check_one(self, name: str, value: Any, bound: dict) -> Any:
        tp = self.inputs[name]
        kind = tp.WhichOneof("value") if tp is not None else None
        if kind in ("sequence_type", "optional_type", "map_type"):
            return _check_nested(repr(name), tp, value)
        # a tensor (or an input of unknown type)
        if isinstance(value, np.generic):
            value = np.asarray(value)
        want = self._dtypes.get(name)
        if not isinstance(value, np.ndarray):
            if hasattr(value, "__array__") and not isinstance(value, (list, tuple, dict, str)):
                value = np.asarray(value)
            elif isinstance(value, list):
                # a Python list converts to the input's element type, as onnxruntime converts it
                try:
                    value = np.asarray(value, dtype=want)
                except (TypeError, ValueError, OverflowError) as e:  # inf or 2**70 into int64
                    raise InvalidArgument(
                        f"input {name!r}: the list does not convert to {type_to_string(tp)}: {e}"
                    ) from None
            else:
                raise InvalidArgument(
                    f"input {name!r} must be a numpy array, got {type(value).__name__}"
                )
        if type(value) is not np.ndarray:
            value = _base_array(repr(name), value)
        if want is not None and (value.dtype != want or want.kind == "O"):
            if want.kind == "O":
                value = _strings(repr(name), value)
            else:
                raise InvalidArgument(
                    f"input {name!r} has dtype {value.dtype}; the model expects {want} "
                    f"({type_to_string(tp)}); cast it explicitly"
                )
        shape = self._shapes.get(name)
        if shape is not None:
            if value.ndim != len(shape):
                raise InvalidArgument(
                    f"input {name!r} has rank {value.ndim} (shape {list(value.shape)}); "
                    f"the model expects rank {len(shape)} {_fmt_shape(shape)}"
                )
            for axis, (want_d, got_d) in enumerate(zip(shape, value.shape)):
                if isinstance(want_d, int):
                    if want_d != got_d:
                        raise InvalidArgument(
                            f"input {name!r} has size {got_d} in dimension {axis}; the model expects "
                            f"{want_d} {_fmt_shape(shape)}, got {list(value.shape)}"
                        )
                elif isinstance(want_d, str) and want_d and want_d not in _ANONYMOUS_DIMS:
                    prev = bound.get(want_d)
                    if prev is None:
                        bound[want_d] = (got_d, name)
                    elif prev[0] != got_d:
                        raise InvalidArgument(
                            f"symbolic dimension {want_d!r} is {prev[0]} in input {prev[1]!r} but "
                            f"{got_d} in input {name!r} (dimension {axis})"
                        )
        return value


def _base_array(label: str, value: np.ndarray) -> np.ndarray:
    """A plain ndarray for a subclass: ``np.matrix`` keeps rank 2 through every
    operation and masked arrays carry a mask kernels know nothing of, so both break
    kernels or come back as subclasses. A masked array is refused (its mask would be
    dropped silently); other subclasses are viewed as plain arrays."""
    if isinstance(value, np.ma.MaskedArray):
        raise InvalidArgument(
            f"input {label} is a masked array; its mask would be ignored: pass value.filled(...) "
            "or np.asarray(value) explicitly"
        )
    return value.view(np.ndarray)


def _strings(label: str, value: np.ndarray) -> np.ndarray:
    """A string tensor as an object array of ``str``: numpy ``U`` arrays convert, ``S``
    arrays and ``bytes`` elements decode as UTF-8, anything else is refused."""
    kind = value.dtype.kind
    if kind == "U":
        return value.astype(object)
    if kind == "S":
        try:
            return np.char.decode(value, "utf-8").astype(object)
        except UnicodeDecodeError as e:
            raise InvalidArgument(f"input {label}: its bytes are not UTF-8 text ({e.reason})") from None
    if kind == "V":
        # np.void elements hold raw bytes: onnxruntime reads each as a UTF-8 string
        try:
            return np.array([bytes(e).decode("utf-8") for e in value.reshape(-1)],
                            dtype=object).reshape(value.shape)
        except UnicodeDecodeError as e:
            raise InvalidArgument(f"input {label}: its bytes are not UTF-8 text ({e.reason})") from None
    if kind != "O":
        raise InvalidArgument(f"input {label} has dtype {value.dtype}; the model expects strings (tensor(string))")
    flat = value.reshape(-1)
    out = None
    for i, v in enumerate(flat):
        if type(v) is str:
            continue
        if isinstance(v, (bytes, np.bytes_)):
            try:
                text = bytes(v).decode("utf-8")
            except UnicodeDecodeError as e:
                raise InvalidArgument(f"input {label}: element {i} is bytes that are not UTF-8 text ({e.reason})") from None
            if out is None:
                out = flat.copy()  # feeds are never modified
            out[i] = text
        elif isinstance(v, str):
            if out is None:
                out = flat.copy()
            out[i] = str(v)
        else:
            raise InvalidArgument(
                f"input {label}: element {i} is {type(v).__name__} {v!r:.40}; a string tensor holds str only"
            )
    return value if out is None else out.reshape(value.shape)


def _check_nested(label: str, tp: TypeProto | None, value: Any) -> Any:
    """Check a value of a sequence, optional or map type, or an element of one, against
    ``tp``; returns it with tensors normalized (plain arrays, strings as ``str``)."""
    kind = tp.WhichOneof("value") if tp is not None else None
    if kind == "optional_type":
        if value is None:
            return None
        inner = tp.optional_type.elem_type
        return _check_nested(label, inner if inner.WhichOneof("value") else None, value)
    if kind == "sequence_type":
        if not isinstance(value, list):
            raise InvalidArgument(f"input {label} expects a sequence (a list of arrays), got {type(value).__name__}")
        et = tp.sequence_type.elem_type
        et = et if et.WhichOneof("value") else None
        return [_check_nested(f"{label}[{i}]", et, v) for i, v in enumerate(value)]
    if kind == "map_type":
        if not isinstance(value, dict):
            raise InvalidArgument(f"input {label} expects a map (a dict), got {type(value).__name__}")
        key_t = tp.map_type.key_type
        vt = tp.map_type.value_type
        want_key = str if key_t == TensorProto.STRING else int
        out = {}
        for k, v in value.items():
            if isinstance(k, np.generic):
                k = k.item()
            if want_key is int and (isinstance(k, bool) or not isinstance(k, int)):
                raise MapKeyTypeError(
                    f"input {label}: key {k!r:.40} is {type(k).__name__}; the map's keys are "
                    f"{elem_type_name(key_t)} (Unexpected key type  {type(k)}, it cannot be linked to C type "
                    f"{_C_KEY_TYPES.get(key_t, elem_type_name(key_t))})"
                )
            if want_key is str and not isinstance(k, str):
                raise MapKeyTypeError(f"input {label}: key {k!r:.40} is {type(k).__name__}; the map's keys are strings "
                                      f"(Unexpected key type  {type(k)}, it cannot be linked to C type std::string)")
            out[k] = _map_value(f"{label}[{k!r:.40}]", vt, v)
        return out
    if kind == "tensor_type":
        if not isinstance(value, np.ndarray):
            if isinstance(value, np.generic):
                value = np.asarray(value)
            else:
                raise InvalidArgument(f"input {label} must be a numpy array, got {type(value).__name__}")
        if type(value) is not np.ndarray:
            value = _base_array(label, value)
        et = tp.tensor_type.elem_type
        if et:
            want = np_dtype(et)
            if want == object:
                return _strings(label, value)
            if value.dtype != want:
                raise InvalidArgument(f"input {label} has dtype {value.dtype}; expected {want} ({type_to_string(tp)})")
        return value
    if isinstance(value, np.ndarray) and type(value) is not np.ndarray:
        return _base_array(label, value)
    return value


def _map_value(label: str, vt: TypeProto, v: Any) -> Any:
    """A map's value: a number (or string) for a tensor value type, as onnxruntime
    takes ``map(int64, float)``; checked against the element type."""
    if vt.WhichOneof("value") != "tensor_type" or not vt.tensor_type.elem_type:
        return _check_nested(label, vt if vt.WhichOneof("value") else None, v)
    want = np_dtype(vt.tensor_type.elem_type)
    if isinstance(v, np.ndarray):
        return _check_nested(label, vt, v)
    if want == object:
        if not isinstance(v, str):
            raise InvalidArgument(f"input {label} is {type(v).__name__}; the map's values are strings")
        return v
    if isinstance(v, (bool, np.bool_)) and want.kind != "b":
        raise InvalidArgument(f"input {label} is a bool; the map's values are {want}")
    if want.kind == "f" and isinstance(v, (int, float, np.integer, np.floating)):
        return v
    if want.kind in "iu" and isinstance(v, (int, np.integer)):
        return v
    if want.kind == "b" and isinstance(v, (bool, np.bool_)):
        return v
    raise InvalidArgument(f"input {label} is {type(v).__name__} {v!r:.40}; the map's values are {want}")


def _fmt_shape(shape: list) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"
