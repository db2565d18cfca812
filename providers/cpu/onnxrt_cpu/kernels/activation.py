"""Activation functions: Relu and friends, the Swish family, Gelu, and the
normalising Softmax / LogSoftmax / Hardmax.

Float32 stays float32; float16 and bfloat16 are computed in float32 and cast back,
since these formulas chain several roundings. Exponentials are arranged so that
they never overflow (Sigmoid, Softplus, Softmax).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from onnxrt.plugin.kernel import DirectCall, Kernel
from onnxrt.run.threads import current_thread_count

from .. import native
from ..parallel import parallel_for, thread_count
from ..registry import op
from .math import erf, is_low_float
from ..rows import SoftmaxRoute, row_max, row_sum, softmax_rows
from ..select import _CLIP_MIN
from ..select import relu as _relu

_F32 = np.dtype(np.float32)


def _float_compute(fn):
    """Run ``fn(k, x, ...)`` on float32 for narrow floats and cast the result back."""

    @functools.wraps(fn)
    def wrapper(k, x, *args, **kw):
        if x.ndim == 0 and not any(getattr(a, "ndim", 0) for a in args):
            # numpy's ufuncs give scalars for rank-0 operands, which the kernels'
            # later in-place steps cannot write: one value, reshaped back
            return wrapper(k, x.reshape(1), *args, **kw).reshape(())
        dt = x.dtype
        with np.errstate(over="ignore", invalid="ignore", under="ignore", divide="ignore"):
            if is_low_float(dt):
                args = tuple(a.astype(_F32) if isinstance(a, np.ndarray) else a for a in args)
                return fn(k, x.astype(_F32), *args, **kw).astype(dt)
            return fn(k, x, *args, **kw)

    return wrapper


def _sigmoid(xp, x):
    # 1 / (1 + exp(-x)): exp overflows to inf only where the true result is below
    # the smallest normal float, and 1 / inf = 0 is then the right answer. This
    # avoids a data-dependent select, which is slow on random signs.
    t = xp.negative(x)
    xp.exp(t, out=t)
    t += 1
    return xp.divide(1, t, out=t)


def swish(xp, x, alpha=1.0):
    """``x * sigmoid(alpha * x)`` (Swish, SiLU at alpha 1, QuickGelu), computed as
    ``x / (1 + exp(-alpha x))``: four passes, where the sigmoid and then a product
    took five or six, and one rounding fewer. exp overflows to inf only where the
    result is below 3e-37 in magnitude, and x / inf is then a zero of x's sign. The
    compiled kernel does the same in one pass (YOLO-style SiLU layers: 1.05 -> 0.3 ms
    a run)."""
    if xp is np:
        y = native.unary(x, native.SWISH, alpha)
        if y is not None:
            return y
    with np.errstate(over="ignore", invalid="ignore"):
        t = xp.negative(x) if alpha == 1.0 else x * x.dtype.type(-alpha)
        xp.exp(t, out=t)
        t += 1
        return xp.divide(x, t, out=t)


def _log1p(xp, t):
    """log(1 + t) for t >= 0, accurate for tiny t (numpy's log1p is slow)."""
    u = t + 1
    # log(u) corrected by the rounding error of 1 + t; when u == 1 this gives t
    corr = u - 1
    corr -= t
    corr /= u
    y = xp.log(u, out=u)
    y -= corr
    return y


def _softplus(xp, x):
    # max(x, 0) + log(1 + exp(-|x|)) never overflows
    t = xp.abs(x)
    xp.negative(t, out=t)
    xp.exp(t, out=t)
    y = _log1p(xp, t)
    y += xp.maximum(x, 0)
    return y


def _amax(x, axis):
    """``x.max(axis, keepdims=True)``, through :func:`row_max` on the last axis."""
    if axis != x.ndim - 1:
        return x.max(axis=axis, keepdims=True)
    return row_max(x)


def _relu_direct(k):
    """``np.maximum(x, 0)``, what Relu computes below the sizes of the compiled and the
    clip passes, for an input whose type and shape are static and that small."""
    dt = k.node.input_dtype(0)
    shape = k.node.input_shape(0)
    if (k.xp is not np or dt is None or dt.kind not in "fi" or shape is None
            or not all(type(d) is int for d in shape) or math.prod(shape) >= min(_CLIP_MIN, native.UNARY_MIN)):
        return None
    if native.RELU_UFUNC is not None and dt in _RELU_UFUNC_TYPES:
        # one operand: the unary ufunc path, cheaper than np.maximum's binary one
        return DirectCall(native.RELU_UFUNC, kwargs={} if shape else {"out": ...})
    zero = np.zeros((), dt)
    zero.flags.writeable = False
    return DirectCall(np.maximum, args=(zero,), kwargs={} if shape else {"out": ...})


#: the element types the Relu ufunc has loops for (others would be cast to one)
_RELU_UFUNC_TYPES = frozenset(np.dtype(t) for t in (np.float32, np.float64, np.int8, np.int16, np.int32, np.int64))


@op("Relu", since=1, direct=_relu_direct)
def relu(k, x):
    """ONNX Relu (integer types from opset 14)."""
    if k.xp is np:
        y = native.unary(x, native.RELU)
        return y if y is not None else _relu(x)
    return k.xp.maximum(x, x.dtype.type(0))


@op("LeakyRelu", since=1)
@_float_compute
def leaky_relu(k, x, *, alpha=0.01):
    """ONNX LeakyRelu."""
    xp = k.xp
    # x for x >= 0, alpha * x below: the larger of the two when alpha <= 1
    return (xp.maximum if alpha <= 1 else xp.minimum)(x, x * alpha)


@op("PRelu", since=1)
def prelu(k, x, slope):
    """ONNX PRelu; ``slope`` broadcasts unidirectionally to ``x``."""
    xp = k.xp
    if k.node.opset < 7 and slope.ndim == 1 and x.ndim > 2 and slope.shape[0] == x.shape[1] != x.shape[-1]:
        # before opset 7 a per-channel slope ran along axis 1
        slope = slope.reshape((-1,) + (1,) * (x.ndim - 2))
    try:
        shape = np.broadcast_shapes(x.shape, slope.shape)
    except ValueError:
        shape = None
    if shape != x.shape:
        raise ValueError(
            f"{k.node.describe()}: slope shape {slope.shape} does not broadcast to input shape {x.shape}"
        )
    dt = x.dtype
    xf = x.astype(_F32) if is_low_float(dt) else x
    # min(x, 0) * slope + max(x, 0): no data-dependent select
    y = xp.minimum(xf, 0)
    y *= slope.astype(xf.dtype, copy=False)
    y += xp.maximum(xf, 0)
    return y.astype(dt, copy=False)


@op("Elu", since=1)
@_float_compute
def elu(k, x, *, alpha=1.0):
    """ONNX Elu."""
    xp = k.xp
    y = xp.expm1(xp.minimum(x, 0))
    y *= alpha
    y += xp.maximum(x, 0)
    return y


@op("Selu", since=1)
@_float_compute
def selu(k, x, *, alpha=1.67326319217681884765625, gamma=1.05070102214813232421875):
    """ONNX Selu."""
    xp = k.xp
    y = xp.expm1(xp.minimum(x, 0))
    y *= alpha
    y += xp.maximum(x, 0)
    y *= gamma
    return y


@op("Celu", since=12)
@_float_compute
def celu(k, x, *, alpha=1.0):
    """ONNX Celu: max(0, x) + min(0, alpha * (exp(x / alpha) - 1))."""
    xp = k.xp
    if alpha == 0:
        raise ValueError(f"{k.node.describe()}: alpha must be nonzero")
    neg = xp.expm1(xp.minimum(x, 0) / alpha) * alpha
    return xp.maximum(x, 0) + xp.minimum(neg, 0)


@_float_compute
def _sigmoid_numpy(k, x):
    return _sigmoid(k.xp, x)


@op("Sigmoid", since=1)
def sigmoid(k, x):
    """ONNX Sigmoid, numerically stable for large |x|."""
    # the compiled kernel first, outside the numpy error-state scope it does not need
    # (1 us of a 3.5 us Sigmoid of one value)
    if k.xp is np:
        y = native.unary(x, native.SIGMOID)
        if y is not None:
            return y
    return _sigmoid_numpy(k, x)


#: Elements from which HardSigmoid and HardSwish go to the compiled ``hard`` kernel:
#: one pass where numpy makes three or four, and the call costs no more than numpy's
#: first ufunc from about this size.
_HARD_MIN = 1024

#: ``hard`` modes (elementwise.c): multiply by x, divide by the factor, the factor first
HARD_GATE, HARD_DIV, HARD_FACTOR_FIRST = 1, 2, 4

#: HardSwish's slope, 1/6 in float32, as the numpy path multiplies by it
_SIXTH = float(np.float32(1.0 / 6.0))


def hard_native(x, mode: int, scale: float, shift: float, lo: float, hi: float, factor: float = 1.0):
    """``clip(x * scale + shift, lo, hi)``, multiplied by ``x`` where ``mode`` has
    :data:`HARD_GATE` and by ``factor`` (divided by it with :data:`HARD_DIV`; before the
    multiplication by x with :data:`HARD_FACTOR_FIRST`), by the compiled kernel in one
    pass over the run's threads, every step rounded to float32 as numpy rounds it; None
    where the kernel does not take ``x`` (not loaded, or not a C-contiguous float32 numpy
    array of at least :data:`_HARD_MIN` elements)."""
    kern = native.K
    if kern is None or type(x) is not np.ndarray or x.size < _HARD_MIN or x.dtype != _F32 \
            or not x.flags.c_contiguous:
        return None
    y = np.empty_like(x)
    kern.hard(x, y, mode, float(scale), float(shift), float(lo), float(hi), float(factor), current_thread_count())
    return y


@op("HardSigmoid", since=1)
@_float_compute
def hard_sigmoid(k, x, *, alpha=0.20000000298023224, beta=0.5):
    """ONNX HardSigmoid: max(0, min(1, alpha * x + beta))."""
    xp = k.xp
    if xp is np:
        # alpha and beta in float32, as numpy's float32 arithmetic takes the Python floats
        y = hard_native(x, 0, float(np.float32(alpha)), float(np.float32(beta)), 0.0, 1.0)
        if y is not None:
            return y
    y = x * alpha
    y += beta
    return xp.clip(y, 0, 1, out=y)


@op("HardSwish", since=14)
@_float_compute
def hard_swish(k, x):
    """ONNX HardSwish: x * max(0, min(1, x / 6 + 0.5))."""
    xp = k.xp
    if xp is np:
        y = hard_native(x, HARD_GATE, _SIXTH, 0.5, 0.0, 1.0)
        if y is not None:
            return y
    y = x * (1.0 / 6.0)
    y += 0.5
    xp.clip(y, 0, 1, out=y)
    y *= x
    return y


@op("HardActivation", since=1, domain="ai.onnxrt")
def hard_activation(k, x, *, scale=1.0, shift=0.0, low=-np.inf, high=np.inf, factor=1.0, divide=0, gate=0,
                    factor_first=0):
    """onnxrt's own op, made by ``hard_activation_fusion`` from the elementwise nodes
    that spell out a HardSwish or a HardSigmoid (``x * Clip(x + 3, 0, 6) / 6``) or a
    scalar affine map (``x * s + b``): ``t = Clip(x * scale + shift, low, high)``, then
    ``t * x`` where ``gate`` and ``t * factor`` (``t / factor`` where ``divide``), the
    factor after the product with x unless ``factor_first``. Each step rounds in ``x``'s
    type as the node it replaces did, so the result is theirs bit for bit."""
    if not isinstance(x, np.ndarray) or x.dtype.kind != "f":
        raise TypeError(f"{k.node.describe()}: X must be a float tensor, got {np.asarray(x).dtype}")
    mode = (HARD_GATE if gate else 0) | (HARD_DIV if divide else 0) | (HARD_FACTOR_FIRST if factor_first else 0)
    if k.xp is np:
        y = hard_native(x, mode, scale, shift, low, high, factor)
        if y is not None:
            return y
    t = x.dtype.type
    shape, x = x.shape, x.reshape(1) if x.ndim == 0 else x  # numpy gives scalars for rank 0
    with np.errstate(over="ignore", invalid="ignore", under="ignore", divide="ignore"):
        y = k.xp.multiply(x, t(scale))
        y += t(shift)
        y = k.xp.clip(y, t(low), t(high), out=y)

        def apply_factor(y):
            if divide:
                y /= t(factor)
            else:
                y *= t(factor)

        if factor_first:
            apply_factor(y)
        if gate:
            y *= x
        if not factor_first:
            apply_factor(y)
    return y.reshape(shape)


@op("Softplus", since=1)
@_float_compute
def softplus(k, x):
    """ONNX Softplus: log(1 + exp(x)), without overflow."""
    return _softplus(k.xp, x)


@op("Softsign", since=1)
@_float_compute
def softsign(k, x):
    """ONNX Softsign: x / (1 + |x|)."""
    xp = k.xp
    d = xp.abs(x)
    d += 1
    return x / d


@op("ThresholdedRelu", since=10)
@_float_compute
def thresholded_relu(k, x, *, alpha=1.0):
    """ONNX ThresholdedRelu: x where x > alpha, else 0 (+0, for NaN and -inf too,
    which a product with the mask would turn into NaN)."""
    xp = k.xp
    return xp.where(x > alpha, x, xp.zeros((), dtype=x.dtype))


@op("Shrink", since=9)
def shrink(k, x, *, lambd=0.5, bias=0.0):
    """ONNX Shrink, on float and integer types."""
    xp = k.xp
    dt = x.dtype
    xf = x.astype(_F32) if is_low_float(dt) else x
    if dt.kind in "iu":
        # compare and offset exactly, in double, then return to the integer type
        xd = xf.astype(np.float64)
        y = xp.where(xd < -lambd, xd + bias, xp.where(xd > lambd, xd - bias, 0.0))
        return y.astype(dt)
    y = xp.where(xf < -lambd, xf + bias, xp.where(xf > lambd, xf - bias, xf.dtype.type(0)))
    return y.astype(dt, copy=False)


#: From this many elements a Gelu is split over the kernel threads: it is some 20
#: numpy passes, long enough to pay for the hand-over (measured with the earlier
#: 28-pass erf: BERT-base's 393,216-value BiasGelu, 1.03 ms on one thread, 0.74 ms on
#: two; more parts than threads was slower). In whole models on the 2-core Intel
#: machine, one session alternating the two settings run by run: BERT-base (393,216
#: values) 12 % slower unsplit; the dynamically quantized transformer encoder at batch
#: 32 (262,144 values) 2-7 % faster unsplit (four comparisons of 60 runs), so the split
#: starts above it.
_GELU_SPLIT = 3 << 17


# erf(x / sqrt(2)) as tanh(x * P(x**2)) for float32 Gelu. P, of degree 6, is a
# weighted least-squares fit of atanh(erf(x / sqrt(2))) / x on [0, 5.5], with the
# weights pushed towards an equal-ripple error in erf. Gelu computed this way in
# float32 is within 5.7e-7 of the exact one on [-12, 12] (the rational erf before
# it: 1.4e-6), and beyond 5.5 the argument of tanh exceeds 9.08, so tanh is exactly
# +-1 there and Gelu is x or 0. tanh is a single vectorized pass, so this takes 19
# passes over the data against 28 for the rational erf (65,536 values: 146 -> 120 us).
_GELU_TANH_P = (1.7563152978619428e-09, -1.322680920256349e-07, 3.9647985920779445e-06,
                -5.530645896847896e-05, -3.259441598169052e-05, 0.03633308413099426,
                0.7978849415467002)


def _gelu_erf(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    f = x.dtype.type
    if x.dtype != np.float32:
        y = erf(x * f(1.0 / math.sqrt(2.0)))
    else:
        z = x * x
        y = z * f(_GELU_TANH_P[0])
        for c in _GELU_TANH_P[1:-1]:
            y += f(c)
            y *= z
        y += f(_GELU_TANH_P[-1])
        y *= x
        np.tanh(y, out=y)
    y += 1
    # halved before x multiplies it, so that x near float's maximum does not overflow
    y *= f(0.5)
    return np.multiply(y, x, out=y if out is None else out)


#: Values a Gelu computes at a time: its 19 passes then run over arrays that stay in
#: the L2 cache, where passes over the whole of a large input reach memory each time.
#: One thread, 262,144 values: 753 -> 682 us; 393,216: 1819 -> 1050 us (chunks of 2**12
#: to 2**15 lost more to the calls than they saved).
_GELU_CHUNK = 1 << 16


def gelu_erf(x: np.ndarray) -> np.ndarray:
    """``0.5 * x * (1 + erf(x / sqrt(2)))`` in ``x``'s (float32 or float64) type.

    float32 goes to the compiled kernel where it is loaded: the same formula in one
    pass instead of 19 (BERT-base's BiasGelu layers 12.5 -> 1.6 ms a run)."""
    y = native.unary(x, native.GELU)
    if y is not None:
        return y
    if x.size <= _GELU_CHUNK or not x.flags.c_contiguous:
        return _gelu_erf(x)
    flat = x.reshape(-1)
    out = np.empty_like(flat)
    threads = min(thread_count(), 8)
    if x.size < _GELU_SPLIT or threads < 2:
        for i in range(0, flat.size, _GELU_CHUNK):
            _gelu_erf(flat[i : i + _GELU_CHUNK], out=out[i : i + _GELU_CHUNK])
        return out.reshape(x.shape)
    cuts = [flat.size * i // threads // 16 * 16 for i in range(threads)] + [flat.size]

    # each thread's part whole: in chunks, two threads' 19 calls per chunk hand the
    # GIL back and forth (BERT-base's 393,216 values: 1.03 of the time)
    def part(i):
        _gelu_erf(flat[cuts[i] : cuts[i + 1]], out=out[cuts[i] : cuts[i + 1]])

    parallel_for(threads, part, threads)
    return out.reshape(x.shape)


@op("Gelu", since=20)
@_float_compute
def gelu(k, x, *, approximate="none"):
    """ONNX Gelu, exact (erf) or with the tanh approximation."""
    xp = k.xp
    if approximate == "tanh":
        inner = x * x
        inner *= 0.044715
        inner += 1
        inner *= x
        inner *= math.sqrt(2.0 / math.pi)
        y = xp.tanh(inner)
    elif approximate == "none":
        # the contrib Gelu's erf form: 19 passes, within 5.7e-7 of the exact function
        # in float32 (the rational erf here before: 28 passes, 1.4e-6)
        return gelu_erf(x)
    else:
        raise ValueError(f"{k.node.describe()}: approximate must be 'none' or 'tanh', got {approximate!r}")
    y += 1
    # halved before x multiplies it, so that x near the float maximum does not overflow
    y *= 0.5
    y *= x
    return y


@op("Mish", since=18)
@_float_compute
def mish(k, x):
    """ONNX Mish: x * tanh(softplus(x))."""
    xp = k.xp
    # tanh(log(1 + t)) = n / (n + 2) with t = exp(x), n = t * (t + 2); beyond x = 20
    # the ratio is 1 in every float type, so clamping keeps n finite
    t = xp.minimum(x, 20)
    xp.exp(t, out=t)
    n = t + 2
    n *= t
    d = n + 2
    n /= d
    n *= x
    return n


@op("Swish", since=24)
@_float_compute
def swish_op(k, x, *, alpha=1.0):
    """ONNX Swish: x * sigmoid(alpha * x)."""
    return swish(k.xp, x, alpha)


@op("SwiGLU", since=28)
def swiglu(k, a, b, *, alpha=1.0):
    """ONNX SwiGLU: Swish_alpha(A) * B, for equal shapes (no broadcasting)."""
    if a.shape != b.shape:
        raise ValueError(f"{k.node.describe()}: A and B must have the same shape, got {a.shape} and {b.shape}")
    if a.dtype != b.dtype:
        raise TypeError(f"{k.node.describe()}: A and B types differ ({a.dtype} and {b.dtype})")
    xp = k.xp
    dt = a.dtype
    low = is_low_float(dt)
    af, bf = (a.astype(_F32), b.astype(_F32)) if low else (a, b)
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        y = swish(xp, af, alpha)
        y *= bf
    return y.astype(dt) if low else y


# -- Softmax family ------------------------------------------------------------------


class _Normalize(Kernel):
    """Shared axis handling: before opset 13 the input is coerced to 2D at ``axis``."""

    native_narrow = False

    def setup(self):
        self.legacy = self.node.opset < 13
        self.axis = int(self.attrs.get("axis", 1 if self.legacy else -1))

    def _apply(self, x):
        raise NotImplementedError

    def run(self, x):
        nd = x.ndim
        axis = self.axis
        hi = nd if self.legacy else nd - 1
        if not -nd <= axis <= hi or nd == 0:
            raise ValueError(f"{self.node.describe()}: axis {self.axis} out of range for rank {nd}")
        if axis < 0:
            axis += nd
        dt = x.dtype
        xf = x if self.native_narrow or not is_low_float(dt) else x.astype(_F32)
        if self.legacy:
            n = math.prod(x.shape[:axis])
            y = self._apply(xf.reshape(n, math.prod(x.shape[axis:])), 1).reshape(x.shape)
        else:
            y = self._apply(xf, axis)
        return (y.astype(dt, copy=False),)


@op("Softmax", since=1)
class Softmax(_Normalize):
    """ONNX Softmax, shifted by the maximum so that exp never overflows.

    float16 and bfloat16 are computed in their own type, rounding after each step
    as the ONNX reference does: attention graphs built from Softmax are checked
    against that rounding to within less than one ulp of those types.
    """

    native_narrow = True

    def setup(self):
        super().setup()
        self._route = SoftmaxRoute()

    def _apply(self, x, axis):
        if x.size == 0:
            return x.copy()
        if axis == x.ndim - 1:
            return softmax_rows(x, self._route)
        with np.errstate(invalid="ignore", over="ignore", under="ignore"):
            y = x - _amax(x, axis)
            np.exp(y, out=y)
            y /= row_sum(y) if axis == x.ndim - 1 else y.sum(axis=axis, keepdims=True)
        return y


@op("LogSoftmax", since=1)
class LogSoftmax(_Normalize):
    """ONNX LogSoftmax: x - max - log(sum(exp(x - max)))."""

    def _apply(self, x, axis):
        if x.size == 0:
            return x.copy()
        with np.errstate(invalid="ignore", over="ignore", under="ignore", divide="ignore"):
            y = x - _amax(x, axis)
            e = np.exp(y)
            y -= np.log(row_sum(e) if axis == x.ndim - 1 else e.sum(axis=axis, keepdims=True))
        return y


@op("Hardmax", since=1)
class Hardmax(_Normalize):
    """ONNX Hardmax: 1 at the first maximum along the axis, 0 elsewhere."""

    def _apply(self, x, axis):
        y = np.zeros_like(x)
        if x.size == 0:
            return y
        idx = np.argmax(x, axis=axis, keepdims=True)
        np.put_along_axis(y, idx, 1, axis=axis)
        return y
