"""Feature preprocessing of the ai.onnx.ml domain: OneHotEncoder, LabelEncoder,
ArrayFeatureExtractor, CategoryMapper, DictVectorizer, FeatureVectorizer, Imputer,
CastMap and ZipMap.

Lookups are vectorised with sorted keys and ``searchsorted`` (string keys too, as
object arrays). Map-typed values are Python dicts; ZipMap returns a list of dicts, one
per row, as onnxruntime does.
"""

from __future__ import annotations

import numpy as np

from onnxrt.plugin.kernel import Kernel

from ..registry import op


class _Lookup:
    """A vectorised key -> value table with a default for missing keys."""

    def __init__(self, keys, values, default, what):
        keys = np.asarray(keys)
        values = np.asarray(values)
        if len(keys) != len(values):
            raise ValueError(f"{what}: {len(keys)} keys but {len(values)} values")
        self.nan_value = None
        if keys.dtype.kind == "f":
            nan = np.isnan(keys)
            if nan.any():
                self.nan_value = values[np.flatnonzero(nan)[0]]
            keys, values = keys[~nan], values[~nan]
        order = np.argsort(keys, kind="stable")
        self.keys = keys[order]
        self.values = values[order]
        self.default = default

    def __call__(self, x, out_dtype):
        x = np.asarray(x)
        out = np.empty(x.shape, dtype=out_dtype)
        flat = x.reshape(-1)
        res = out.reshape(-1)
        res[...] = self.default
        if len(self.keys) and flat.size:
            if self.keys.dtype == object or flat.dtype == object:
                flat_k = flat.astype(object)
                keys = self.keys.astype(object)
            else:
                flat_k, keys = flat, self.keys
            pos = np.minimum(np.searchsorted(keys, flat_k), len(keys) - 1)
            hit = keys[pos] == flat_k
            res[hit] = self.values[pos[hit]]
        if self.nan_value is not None and flat.dtype.kind == "f":
            res[np.isnan(flat)] = self.nan_value
        return out


def _str_array(v):
    return np.array(list(v), dtype=object)


# -- OneHotEncoder --------------------------------------------------------------------
@op("OneHotEncoder", since=1, domain="ai.onnx.ml")
class OneHotEncoder(Kernel):
    """One float column per category: Y has X's shape plus [n_categories]."""

    def setup(self):
        a = self.attrs
        strings = a.get("cats_strings") or []
        ints = a.get("cats_int64s") or []
        if strings:
            self.cats = _str_array(strings)
        elif ints:
            self.cats = np.asarray(ints, dtype=np.int64)
        else:
            raise ValueError(f"{self.node.describe()}: cats_strings or cats_int64s is required")
        self.strings = bool(strings)
        self.zeros = int(a.get("zeros", 1))
        self.lookup = _Lookup(self.cats, np.arange(len(self.cats)), -1, self.node.describe())

    def run(self, x):
        x = np.asarray(x)
        if self.strings != (x.dtype == object):
            raise ValueError(f"{self.node.describe()}: input type {x.dtype} does not match the categories")
        if x.dtype.kind == "f":
            x = x.astype(np.int64)
        idx = self.lookup(x, np.int64)
        if not self.zeros and (idx < 0).any():
            bad = x.reshape(-1)[np.flatnonzero(idx.reshape(-1) < 0)[0]]
            raise ValueError(f"{self.node.describe()}: value {bad!r} is not a category and zeros=0")
        y = np.zeros(x.shape + (len(self.cats),), dtype=np.float32)
        flat = y.reshape(-1, len(self.cats))
        fi = idx.reshape(-1)
        ok = np.flatnonzero(fi >= 0)
        flat[ok, fi[ok]] = 1.0
        return (y,)


# -- LabelEncoder ---------------------------------------------------------------------
_DEFAULTS = {"string": "_Unused", "int64": -1, "float": -0.0}


def _le_attr(a, kind):
    """keys/values of one kind from the typed list attributes, or None."""
    v = a.get(f"{kind}_strings")
    if v:
        return _str_array(v)
    v = a.get(f"{kind}_int64s")
    if v:
        return np.asarray(v, dtype=np.int64)
    v = a.get(f"{kind}_floats")
    if v:
        return np.asarray(v, dtype=np.float32)
    return None


@op("LabelEncoder", since=1, domain="ai.onnx.ml")
class LabelEncoder(Kernel):
    """Maps keys to values; missing keys get the default of the output type."""

    def setup(self):
        a = self.attrs
        what = self.node.describe()
        if self.node.opset < 2:
            classes = _str_array(a.get("classes_strings") or [])
            self.v1 = (classes, a.get("default_int64", -1), a.get("default_string", "_Unused"))
            return
        self.v1 = None
        keys = a.get("keys_tensor")
        values = a.get("values_tensor")
        keys = np.asarray(keys).reshape(-1) if keys is not None else _le_attr(a, "keys")
        values = np.asarray(values).reshape(-1) if values is not None else _le_attr(a, "values")
        if keys is None or values is None:
            raise ValueError(f"{what}: keys and values are required")
        if keys.dtype.kind in "US":
            keys = keys.astype(object)
        if values.dtype.kind in "US":
            values = values.astype(object)
        self.out_dtype = values.dtype
        dt = a.get("default_tensor")
        if dt is not None:
            default = np.asarray(dt).reshape(-1)[0]
        elif values.dtype == object:
            default = a.get("default_string", "_Unused")
        elif values.dtype.kind == "f":
            default = a.get("default_float", -0.0)
        else:
            default = a.get("default_int64", -1)
        if isinstance(default, bytes):
            default = default.decode("utf-8")
        self.table = _Lookup(keys, values, default, what)
        self.key_is_str = keys.dtype == object

    def run(self, x):
        x = np.asarray(x)
        if self.v1 is not None:
            classes, d_int, d_str = self.v1
            if x.dtype == object:
                return (_Lookup(classes, np.arange(len(classes)), d_int, "")(x, np.int64),)
            idx = x.astype(np.int64)
            out = np.full(x.shape, d_str, dtype=object)
            ok = (idx >= 0) & (idx < len(classes))
            out[ok] = classes[idx[ok]]
            return (out,)
        if self.key_is_str != (x.dtype == object):
            raise ValueError(f"{self.node.describe()}: input type {x.dtype} does not match the keys")
        return (self.table(x, self.out_dtype),)


# -- ArrayFeatureExtractor ------------------------------------------------------------
@op("ArrayFeatureExtractor", since=1, domain="ai.onnx.ml")
def array_feature_extractor(k, x, y):
    """Select entries along the last axis: [..., F] -> [..., len(Y)] ([1, len(Y)] for 1-D X)."""
    x = np.asarray(x)
    idx = np.asarray(y).astype(np.int64).reshape(-1)
    f = x.shape[-1] if x.ndim else 0
    if idx.size == 0:
        raise ValueError("ArrayFeatureExtractor: the index tensor is empty")
    bad = (idx < 0) | (idx >= f)
    if bad.any():
        raise IndexError(f"ArrayFeatureExtractor: index {int(idx[bad][0])} is out of range for {f} features")
    if x.ndim == 1:
        return x[idx][None, :]
    return x[..., idx]


# -- CategoryMapper -------------------------------------------------------------------
@op("CategoryMapper", since=1, domain="ai.onnx.ml")
class CategoryMapper(Kernel):
    """strings <-> int64 through the paired cats_strings / cats_int64s lists."""

    def setup(self):
        a = self.attrs
        what = self.node.describe()
        s = _str_array(a.get("cats_strings") or [])
        i = np.asarray(a.get("cats_int64s") or [], dtype=np.int64)
        if len(s) != len(i):
            raise ValueError(f"{what}: cats_strings and cats_int64s differ in length")
        self.to_int = _Lookup(s, i, int(a.get("default_int64", -1)), what)
        self.to_str = _Lookup(i, s, a.get("default_string", "_Unused"), what)

    def run(self, x):
        x = np.asarray(x)
        if x.dtype == object:
            return (self.to_int(x, np.int64),)
        return (self.to_str(x.astype(np.int64), object),)


# -- DictVectorizer -------------------------------------------------------------------
@op("DictVectorizer", since=1, domain="ai.onnx.ml")
class DictVectorizer(Kernel):
    """A map (or a list of maps) to a dense [N, vocabulary] tensor."""

    def setup(self):
        a = self.attrs
        strings = a.get("string_vocabulary") or []
        ints = a.get("int64_vocabulary") or []
        if strings:
            self.vocab = {k: i for i, k in enumerate(strings)}
        else:
            self.vocab = {int(k): i for i, k in enumerate(ints)}
        self.size = len(strings) or len(ints)
        self.out_dtype = self.node.output_dtype(0)

    def run(self, x):
        rows = x if isinstance(x, (list, tuple)) else [x]
        dt = self.out_dtype
        if dt is None:
            dt = _value_dtype(rows)
        out = np.zeros((len(rows), self.size), dtype=dt)
        if dt == object:
            out[...] = ""
        # a map is a Python dict; its keys are matched one row at a time
        for r, m in enumerate(rows):
            if not isinstance(m, dict):
                raise ValueError(f"{self.node.describe()}: expected a map, got {type(m).__name__}")
            for key, v in m.items():
                j = self.vocab.get(key if isinstance(key, str) else int(key))
                if j is not None:
                    out[r, j] = v
        return (out,)


def _value_dtype(rows):
    for m in rows:
        for v in m.values() if isinstance(m, dict) else ():
            if isinstance(v, str):
                return np.dtype(object)
            if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
                return np.dtype(np.int64)
            if isinstance(v, np.floating):
                return np.asarray(v).dtype
            return np.dtype(np.float32)
    return np.dtype(np.float32)


# -- FeatureVectorizer ----------------------------------------------------------------
@op("FeatureVectorizer", since=1, domain="ai.onnx.ml")
class FeatureVectorizer(Kernel):
    """Concatenate inputs along the features axis into a float [N, sum(dims)] tensor."""

    def setup(self):
        self.dims = [int(d) for d in self.attrs.get("inputdimensions") or []]

    def run(self, *xs):
        xs = [np.asarray(v) for v in xs if v is not None]
        if not xs:
            raise ValueError(f"{self.node.describe()}: no inputs")
        # a 1-D input is one row [1, C], as the spec says; higher ranks are [N, rest]
        xs = [v.reshape(1, -1) if v.ndim <= 1 else v.reshape(v.shape[0], -1) for v in xs]
        dims = self.dims or [v.shape[1] for v in xs]
        if len(dims) != len(xs):
            raise ValueError(f"{self.node.describe()}: {len(xs)} inputs but {len(dims)} inputdimensions")
        n = xs[0].shape[0]
        if any(v.shape[0] != n for v in xs):
            raise ValueError(
                f"{self.node.describe()}: inputs have different numbers of rows {[v.shape[0] for v in xs]}"
            )
        out = np.zeros((n, sum(dims)), dtype=np.float32)
        col = 0
        for v, d in zip(xs, dims):
            v2 = v.astype(np.float32, copy=False)
            w = min(d, v2.shape[1])
            out[:, col : col + w] = v2[:, :w]
            col += d
        return (out,)


# -- Imputer --------------------------------------------------------------------------
@op("Imputer", since=1, domain="ai.onnx.ml")
class Imputer(Kernel):
    """Replace a sentinel value (NaN allowed) by per-feature or global imputed values."""

    def setup(self):
        a = self.attrs
        self.f_vals = np.asarray(a.get("imputed_value_floats") or [], dtype=np.float32)
        self.i_vals = np.asarray(a.get("imputed_value_int64s") or [], dtype=np.int64)
        self.f_rep = float(a.get("replaced_value_float", 0.0))
        self.i_rep = int(a.get("replaced_value_int64", 0))

    def run(self, x):
        x = np.asarray(x)
        if x.dtype.kind == "f":
            vals, rep = self.f_vals, self.f_rep
            mask = np.isnan(x) if np.isnan(rep) else x == x.dtype.type(rep)
        else:
            vals, rep = self.i_vals, self.i_rep
            mask = x == rep
        if len(vals) == 0:
            raise ValueError(f"{self.node.describe()}: no imputed values for input type {x.dtype}")
        f = x.shape[-1] if x.ndim else 1
        if len(vals) not in (1, f):
            raise ValueError(f"{self.node.describe()}: {len(vals)} imputed values for {f} features")
        fill = np.broadcast_to(vals.astype(x.dtype), x.shape) if x.ndim else vals[0]
        return (np.where(mask, fill, x),)


# -- CastMap --------------------------------------------------------------------------
@op("CastMap", since=1, domain="ai.onnx.ml")
class CastMap(Kernel):
    """A map int64 -> (string | float) to a [1, N] tensor ordered by key."""

    def setup(self):
        a = self.attrs
        self.cast_to = a.get("cast_to", "TO_FLOAT")
        self.form = a.get("map_form", "DENSE")
        self.max_map = int(a.get("max_map", 1))
        if self.cast_to not in ("TO_FLOAT", "TO_STRING", "TO_INT64"):
            raise ValueError(f"{self.node.describe()}: unknown cast_to {self.cast_to!r}")
        if self.form not in ("DENSE", "SPARSE"):
            raise ValueError(f"{self.node.describe()}: unknown map_form {self.form!r}")

    def run(self, m):
        if not isinstance(m, dict):
            raise ValueError(f"{self.node.describe()}: expected a map, got {type(m).__name__}")
        keys = np.array(sorted(int(k) for k in m), dtype=np.int64)
        vals = [m[k] for k in sorted(m, key=int)]
        if self.cast_to == "TO_STRING":
            dt, conv, fill = object, _to_str, "0"
        elif self.cast_to == "TO_INT64":
            dt, conv, fill = np.int64, lambda v: np.int64(float(v)), 0
        else:
            dt, conv, fill = np.float32, lambda v: np.float32(v), 0.0
        cv = np.array([conv(v) for v in vals], dtype=dt)
        if self.form == "DENSE":
            return (cv.reshape(1, -1),)
        out = np.full(self.max_map, fill, dtype=dt)
        ok = (keys >= 0) & (keys < self.max_map)
        if not ok.all():
            raise IndexError(f"{self.node.describe()}: key {int(keys[~ok][0])} is outside [0, max_map)")
        out[keys] = cv
        return (out.reshape(1, -1),)


def _to_str(v):
    if isinstance(v, str):
        return v
    f = float(v)
    return repr(f) if not f.is_integer() else str(int(f)) if abs(f) < 1e16 else repr(f)


# -- ZipMap ---------------------------------------------------------------------------
@op("ZipMap", since=1, domain="ai.onnx.ml")
class ZipMap(Kernel):
    """Rows of class scores to a list of {label: score} dicts."""

    def setup(self):
        a = self.attrs
        strings = a.get("classlabels_strings") or []
        ints = a.get("classlabels_int64s") or []
        if not strings and not ints:
            raise ValueError(f"{self.node.describe()}: classlabels_strings or classlabels_int64s is required")
        self.labels = list(strings) if strings else [int(v) for v in ints]

    def run(self, x):
        x = np.asarray(x)
        if x.ndim == 1:
            x = x[None, :]
        if x.ndim != 2 or x.shape[1] != len(self.labels):
            raise ValueError(f"{self.node.describe()}: input shape {x.shape} does not have "
                             f"{len(self.labels)} columns")
        labels = self.labels
        return ([dict(zip(labels, row)) for row in x.tolist()],)
