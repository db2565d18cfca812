"""Elementwise math: unary functions, arithmetic, variadic Max/Min/Sum/Mean, Clip,
Where, NaN/Inf tests, bitwise ops, and a few non-elementwise math ops (Det, CumSum,
CumProd, Einsum).

float16 and bfloat16 inputs are computed in float32 and cast back (numpy has no
native bfloat16 math); float32 stays float32 throughout. Integer arithmetic wraps
like C, and integer division or modulo by zero gives 0 instead of trapping.
"""

from __future__ import annotations

import numpy as np

from onnxrt.plugin.kernel import DirectCall, Kernel
from onnxrt.run.limits import allocation_limit, check_allocation
from onnxrt.run.threads import current_thread_count

from .. import native
from ..registry import op
from ..rows import broadcast_buffer, columns_op, row_vector
from ..select import _clip as _clip_ufunc
from ..select import clamp
from ..select import where as _blend_where

__all__ = ["erf", "is_low_float", "upcast", "legacy_broadcast"]

_F32 = np.dtype(np.float32)
_F16 = np.dtype(np.float16)


# -- helpers shared with the activation kernels ------------------------------------


def is_low_float(dt: np.dtype) -> bool:
    """Whether ``dt`` is a float narrower than float32 (float16, bfloat16, float8...)."""
    return dt == _F16 or (dt.kind == "V" and dt.itemsize <= 2)


def upcast(x):
    """``x`` as float32 when it is a narrow float, else ``x`` itself."""
    return x.astype(_F32) if is_low_float(x.dtype) else x


def _cast_back(y, dt: np.dtype):
    return y if y.dtype == dt else y.astype(dt)


def legacy_broadcast(k, a, b):
    """Apply the opset < 7 ``broadcast``/``axis`` attributes to ``b``.

    With ``axis`` given, ``b``'s shape matches ``a``'s starting at ``axis``; numpy's
    suffix broadcasting then covers every other case the old spec allowed.
    """
    node = k.node
    if node.opset >= 7 or not node.attrs.get("broadcast", 0) or "axis" not in node.attrs:
        return b
    a_nd, b_nd = np.ndim(a), np.ndim(b)
    if b_nd == 0:
        return b
    axis = node.attrs["axis"]
    if axis < 0:
        axis += a_nd
    if not 0 <= axis <= a_nd - b_nd:
        raise ValueError(
            f"{node.describe()}: broadcast axis {node.attrs['axis']} does not fit shapes "
            f"{np.shape(a)} and {np.shape(b)}"
        )
    return b.reshape(b.shape + (1,) * (a_nd - axis - b_nd))


# -- erf -----------------------------------------------------------------------------
# float64: the rational approximations of fdlibm's s_erf.c (Sun Microsystems, 1993),
# evaluated on the elements of each interval; error below 1 ulp.

_ERX = 8.45062911510467529297e-01
_EFX8 = 1.02703333676410069053e00
_PP = (1.28379167095512558561e-01, -3.25042107247001499370e-01, -2.84817495755985104766e-02,
       -5.77027029648944159157e-03, -2.37630166566501626084e-05)
_QQ = (1.0, 3.97917223959155352819e-01, 6.50222499887672944485e-02, 5.08130628187576562776e-03,
       1.32494738004321644526e-04, -3.96022827877536812320e-06)
_PA = (-2.36211856075265944077e-03, 4.14856118683748331666e-01, -3.72207876035701323847e-01,
       3.18346619901161753674e-01, -1.10894694282396677476e-01, 3.54783043256182359371e-02,
       -2.16637559486879084300e-03)
_QA = (1.0, 1.06420880400844228286e-01, 5.40397917702171048937e-01, 7.18286544141962662868e-02,
       1.26171219808761642112e-01, 1.36370839120290507362e-02, 1.19844998467991074170e-02)
_RA = (-9.86494403484714822705e-03, -6.93858572707181764372e-01, -1.05586262253232909814e01,
       -6.23753324503260060396e01, -1.62396669462573470355e02, -1.84605092906711035994e02,
       -8.12874355063065934246e01, -9.81432934416914548592e00)
_SA = (1.0, 1.96512716674392571292e01, 1.37657754143519042600e02, 4.34565877475229228821e02,
       6.45387271733267880336e02, 4.29008140027567833386e02, 1.08635005541779435134e02,
       6.57024977031928170135e00, -6.04244152148580987438e-02)
_RB = (-9.86494292470009928597e-03, -7.99283237680523006574e-01, -1.77579549177547519889e01,
       -1.60636384855821916062e02, -6.37566443368389627722e02, -1.02509513161107724954e03,
       -4.83519191608651397019e02)
_SB = (1.0, 3.03380607434824582924e01, 3.25792512996573918826e02, 1.53672958608443695994e03,
       3.19985821950859553908e03, 2.55305040643316442583e03, 4.74528541206955367215e02,
       -2.24409524465858183362e01)


def _horner(z, coefs):
    r = np.full_like(z, coefs[-1])
    for c in coefs[-2::-1]:
        r *= z
        r += c
    return r


def _erfc_tail(ax):
    """erfc(ax) for 1.25 <= ax < 6 (float64)."""
    s = 1.0 / (ax * ax)
    near = ax < 1.0 / 0.35
    rs = np.empty_like(ax)
    if near.any():
        sn = s[near]
        rs[near] = _horner(sn, _RA) / _horner(sn, _SA)
    far = ~near
    if far.any():
        sf = s[far]
        rs[far] = _horner(sf, _RB) / _horner(sf, _SB)
    # z is ax with the low 32 bits cleared, so that z*z is exact
    z = (ax.view(np.uint64) & np.uint64(0xFFFFFFFF00000000)).view(np.float64)
    return np.exp(-z * z - 0.5625) * np.exp((z - ax) * (z + ax) + rs) / ax


# float32 and narrower: a single odd/even rational in x on [-4, 4] (erf is +-1 in
# float32 beyond), evaluated in float32; within 4 ulp of the true value.
_ERF32_P = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06,
            -5.69250639462346e-05, -7.34990630326855e-04, -2.95459980854025e-03,
            -1.60960333262415e-02)
_ERF32_Q = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03,
            -7.37332916720468e-03, -1.42647390514189e-02)


def _erf32(x):
    x = _clip_ufunc(x, x.dtype.type(-4.0), x.dtype.type(4.0))  # NaN passes through
    z = x * x
    # Horner's rule, each step in place; the first step starts from z * c0 rather
    # than a filled array (one pass fewer per polynomial)
    p = z * z.dtype.type(_ERF32_P[0])
    for c in _ERF32_P[1:-1]:
        p += c
        p *= z
    p += _ERF32_P[-1]
    q = z * z.dtype.type(_ERF32_Q[0])
    for c in _ERF32_Q[1:-1]:
        q += c
        q *= z
    q += _ERF32_Q[-1]
    p *= x
    p /= q
    return p


def erf(x):
    """The error function of a float array, same dtype out.

    float64 uses the fdlibm approximations (below 1 ulp); other floats a float32
    rational approximation.
    """
    dt = x.dtype
    if dt != np.float64:
        return _cast_back(_erf32(x.astype(_F32, copy=False)), dt)
    xd = x
    ax = np.abs(xd)
    out = np.empty_like(xd)
    small = ax < 0.84375
    if small.any():
        xs = xd[small]
        z = xs * xs
        y = xs + xs * (_horner(z, _PP) / _horner(z, _QQ))
        tiny = np.abs(xs) < 2.0**-28
        if tiny.any():
            y[tiny] = xs[tiny] + xs[tiny] * (_EFX8 / 8.0)
        out[small] = y
    mid = (ax >= 0.84375) & (ax < 1.25)
    if mid.any():
        s = ax[mid] - 1.0
        out[mid] = np.copysign(_ERX + _horner(s, _PA) / _horner(s, _QA), xd[mid])
    tail = (ax >= 1.25) & (ax < 6.0)
    if tail.any():
        out[tail] = np.copysign(1.0 - _erfc_tail(ax[tail]), xd[tail])
    big = ax >= 6.0  # also +-inf; NaN fails every comparison and is handled below
    if big.any():
        out[big] = np.copysign(1.0, xd[big])
    nan = np.isnan(xd)
    if nan.any():
        out[nan] = np.nan
    return _cast_back(out, dt)


# -- unary ---------------------------------------------------------------------------


def _register_unary(name, since, fn, *, narrow_direct=False, ufunc=None):
    """Register ``fn(xp, x)``; narrow floats go through float32 unless ``narrow_direct``.
    ``ufunc``: the numpy ufunc ``fn`` computes, the plan's direct call for numpy inputs
    of a static type that is not a narrow float."""

    def kernel(k, x):
        if not narrow_direct and is_low_float(x.dtype) and x.dtype.kind in "fV":
            return _cast_back(fn(k.xp, x.astype(_F32)), x.dtype)
        return fn(k.xp, x)

    kernel.__name__ = name
    kernel.__qualname__ = name
    kernel.__doc__ = f"ONNX {name}."
    op(name, since=since, direct=None if ufunc is None else _unary_direct(ufunc))(kernel)


def _plain_dtype(k, i: int):
    """Input ``i``'s static dtype where numpy computes in it directly (not a narrow
    float), else None."""
    dt = k.node.input_dtype(i)
    return None if dt is None or is_low_float(dt) or dt.kind == "V" else dt


def _ufunc_call(ufunc, shape) -> DirectCall:
    """``ufunc`` as a direct call; ``out=...`` unless the rank is known to be at least 1,
    so that 0-d inputs give a 0-d array and not a numpy scalar."""
    return DirectCall(ufunc, kwargs={} if shape else {"out": ...})


def _unary_direct(ufunc):
    def direct(k):
        # the run's np.errstate(all="ignore") covers what the guarded ops enter
        if k.xp is not np or _plain_dtype(k, 0) is None:
            return None
        return _ufunc_call(ufunc, k.node.input_shape(0))

    return direct


def _sign(xp, x):
    if x.dtype.kind == "b":
        return x.copy()
    return xp.sign(x)


def _abs(xp, x):
    return xp.abs(x) if x.dtype.kind != "u" else x.copy()


def _neg(xp, x):
    return xp.negative(x)


def _reciprocal(xp, x):
    with np.errstate(divide="ignore"):
        return xp.divide(x.dtype.type(1), x)


def _log(xp, x):
    with np.errstate(divide="ignore", invalid="ignore"):
        return xp.log(x)


def _sqrt(xp, x):
    with np.errstate(invalid="ignore"):
        return xp.sqrt(x)


def _guarded(f):
    def g(xp, x):
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            return getattr(xp, f)(x)

    return g


_register_unary("Abs", 1, _abs, ufunc=np.absolute)  # of an unsigned array: a copy either way
_register_unary("Neg", 1, _neg, ufunc=np.negative)
_register_unary("Sign", 9, _sign)
_register_unary("Reciprocal", 1, _reciprocal)
_register_unary("Floor", 1, lambda xp, x: xp.floor(x), ufunc=np.floor)
_register_unary("Ceil", 1, lambda xp, x: xp.ceil(x), ufunc=np.ceil)
_register_unary("Round", 11, lambda xp, x: xp.round(x))  # numpy rounds half to even
_register_unary("Sqrt", 1, _sqrt, ufunc=np.sqrt)
_register_unary("Exp", 1, _guarded("exp"), ufunc=np.exp)
_register_unary("Log", 1, _log, ufunc=np.log)
_register_unary("Sin", 7, _guarded("sin"))
_register_unary("Cos", 7, _guarded("cos"))
_register_unary("Tan", 7, _guarded("tan"))
_register_unary("Asin", 7, _guarded("arcsin"))
_register_unary("Acos", 7, _guarded("arccos"))
_register_unary("Atan", 7, _guarded("arctan"))
_register_unary("Sinh", 9, _guarded("sinh"))
_register_unary("Cosh", 9, _guarded("cosh"))
_register_unary("Tanh", 1, _guarded("tanh"), ufunc=np.tanh)
_register_unary("Asinh", 9, _guarded("arcsinh"))
_register_unary("Acosh", 9, _guarded("arccosh"))
_register_unary("Atanh", 9, _guarded("arctanh"))
_register_unary("Erf", 9, lambda xp, x: erf(x), narrow_direct=True)
_register_unary("BitwiseNot", 18, lambda xp, x: xp.invert(x))


# -- binary arithmetic ---------------------------------------------------------------


def _check_int_divisor(b, what: str) -> None:
    """Integer division by zero is undefined; onnxruntime fails the run, and so does
    this (numpy would quietly give 0)."""
    if not b.all():
        raise ValueError(f"Integer {what} by zero")


def _int_div(a, b):
    """Integer division truncating toward zero, as C does."""
    _check_int_divisor(b, "division")
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        if a.dtype.kind == "u" and b.dtype.kind == "u":
            return np.floor_divide(a, b)
        # a - fmod(a, b) is an exact multiple of b, so floor division is exact
        return np.floor_divide(a - np.fmod(a, b), b)


_UFUNCS = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide}


def _with_row_vector(name, a, b):
    """``a op b`` where one operand is a row vector (``[N]``, or ``[1, ..., N]``) and the
    other a larger C-contiguous array ``[..., N]`` of the same type (a bias added to
    a product's rows): through :func:`rows.columns_op`, whose long inner loop numpy's
    broadcasting lacks; None for anything else."""
    if name == "Div" and a.dtype.kind != "f":
        return None
    big, vec, first = (a, b, False) if a.size >= b.size else (b, a, True)
    row = row_vector(vec, big)
    if row is None:
        return None
    return columns_op(_UFUNCS[name], big, row, out=np.empty(big.shape, big.dtype), vec_first=first)


def _check_broadcast(k, dtype, *xs) -> None:
    """Refuse a broadcast result over the allocation cap before it is made.

    Broadcasting ``[N, 1]`` with ``[1, N]`` makes ``N * N`` values from ``2 N``; the
    result never holds more than the product of the operands' sizes, so that cheap
    bound decides whether the exact shape is worth computing."""
    bound = dtype.itemsize
    for x in xs:
        bound *= x.size
    if bound > allocation_limit():
        shape = np.broadcast_shapes(*(x.shape for x in xs))
        check_allocation(shape, dtype, f"{k.node.op_type} output")


#: ``binary`` ops (elementwise.c)
_BINARY_OPS = {"Add": 0, "Sub": 1, "Mul": 2, "Div": 3}


def _plane_op(name, a, b):
    """``a op b`` (Add, Sub, Mul, Div) where one operand is a C-contiguous float32 array
    and the other holds one value per plane of it (equal to it on the leading axes and
    1 on the rest: the ``[N, C, 1, 1]`` scale of a squeeze-and-excitation block over
    ``[N, C, H, W]``, a per-channel bias), by the compiled kernel in one pass over the
    run's threads, into the one array it allocates; None for anything else. The values
    are numpy's: one IEEE operation each, in the operands' order."""
    kern = native.K
    if kern is None or a.dtype != _F32 or b.dtype != _F32:
        return None
    big, small = (a, b) if a.size >= b.size else (b, a)
    if big.size < native.UNARY_MIN or small.size < 2 or small.ndim > big.ndim or not big.flags.c_contiguous:
        return None
    shape = (1,) * (big.ndim - small.ndim) + small.shape
    lead = len(shape)
    while lead and shape[lead - 1] == 1:
        lead -= 1
    if lead == len(shape) or shape[:lead] != big.shape[:lead]:
        return None  # no broadcast, or a broadcast over a leading axis
    y = np.empty(big.shape, _F32)
    kern.binary(big, np.ascontiguousarray(small), y, _BINARY_OPS[name], big.size // small.size, small is a,
                current_thread_count())
    return y


def _binary(xp, name, a, b):
    if xp is np:
        if a.shape != b.shape:
            y = _plane_op(name, a, b)
            if y is not None:
                return y
        y = _with_row_vector(name, a, b)
        if y is not None:
            return y
        if a.shape != b.shape and max(a.size, b.size) >= 1 << 15:
            with broadcast_buffer(np.broadcast_shapes(a.shape, b.shape), a.shape, b.shape):
                return _binary_op(xp, name, a, b)
    return _binary_op(xp, name, a, b)


def _binary_op(xp, name, a, b):
    if name == "Add":
        return xp.add(a, b)
    if name == "Sub":
        return xp.subtract(a, b)
    if name == "Mul":
        return xp.multiply(a, b)
    if a.dtype.kind in "iu":
        return _int_div(a, b)
    with np.errstate(divide="ignore", invalid="ignore"):
        return xp.divide(a, b)


def _register_arith(name):
    def kernel(k, a, b):
        b = legacy_broadcast(k, a, b)
        if a.dtype != b.dtype:
            raise TypeError(f"{k.node.describe()}: input types differ ({a.dtype} and {b.dtype})")
        if a.shape != b.shape:
            _check_broadcast(k, a.dtype, a, b)
        if a.dtype.kind == "V":
            return _binary(k.xp, name, a.astype(_F32), b.astype(_F32)).astype(a.dtype)
        # overflow gives inf silently: the run loop holds np.errstate(all="ignore")
        return _binary(k.xp, name, a, b)

    def direct(k):
        # inputs of one static type and one static shape: no broadcast (so no row or
        # buffer pass and no cap to check), no legacy attributes, no integer division
        if k.xp is not np or k.node.opset < 7:
            return None
        a, b = _plain_dtype(k, 0), _plain_dtype(k, 1)
        if a is None or a != b or (name == "Div" and a.kind != "f"):
            return None
        sa, sb = k.node.input_shape(0), k.node.input_shape(1)
        if sa is None or sa != sb or None in sa:
            return None
        return _ufunc_call(_UFUNCS[name], sa)

    kernel.__name__ = name
    kernel.__qualname__ = name
    kernel.__doc__ = f"ONNX {name} with numpy broadcasting (and the opset < 7 broadcast attribute)."
    op(name, since=1, direct=direct)(kernel)


for _name in ("Add", "Sub", "Mul", "Div"):
    _register_arith(_name)


@op("Mod", since=10)
def mod(k, a, b, *, fmod=0):
    """ONNX Mod: fmod=0 takes the sign of the divisor, fmod=1 that of the dividend."""
    if a.dtype != b.dtype:
        raise TypeError(f"{k.node.describe()}: input types differ ({a.dtype} and {b.dtype})")
    dt = a.dtype
    if fmod not in (0, 1):
        raise ValueError(f"{k.node.describe()}: fmod must be 0 or 1, got {fmod}")
    low = is_low_float(dt)
    if low:
        a, b = a.astype(_F32), b.astype(_F32)
    if dt.kind in "iu":
        _check_int_divisor(b, "modulo")
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.fmod(a, b) if fmod else np.remainder(a, b)
    return _cast_back(r, dt) if low else r


@op("Pow", since=1)
def pow_(k, x, y):
    """ONNX Pow: the result has the base's type; integer powers are exact."""
    y = legacy_broadcast(k, x, y)
    xt, yt = x.dtype, y.dtype
    with np.errstate(all="ignore"):
        if xt.kind in "iu":
            if yt.kind in "iu":
                return _int_pow(x, y)
            # a float exponent on an integer base: compute in double, truncate
            return np.power(x.astype(np.float64), y.astype(np.float64)).astype(xt)
        if y.size == 1 and y.ndim <= x.ndim:
            # squaring dominates in practice and np.power is several times slower
            v = float(y.reshape(()).astype(np.float64))
            if v == 2.0:
                xc = upcast(x)
                return _cast_back(np.multiply(xc, xc), xt)
            if v == 1.0:
                return x.copy()
        if is_low_float(xt):
            xc = x.astype(_F32)
            yc = y.astype(np.float64 if yt == np.float64 else _F32)
            return np.power(xc, yc).astype(xt)
        if yt != xt:
            if yt == np.float64 or (yt.kind in "iu" and yt.itemsize > 4):
                if yt.kind in "iu" and xt == _F32:
                    yc = y.astype(_F32)
                    # large integer exponents do not round-trip through float32
                    if np.array_equal(yc.astype(yt), y):
                        return np.power(x, yc)
                return np.power(x.astype(np.float64), y.astype(np.float64)).astype(xt)
            y = y.astype(xt)
        return np.power(x, y)


def _int_pow(x, y):
    yc = y.astype(x.dtype)
    neg = yc < 0
    if not neg.any():
        return np.power(x, yc)
    # x ** -n is 0 unless |x| == 1 (x == 0 would be infinite; give 0)
    r = np.power(x, np.where(neg, 0, yc).astype(x.dtype))
    one = np.ones((), dtype=x.dtype)
    odd = (yc % 2) != 0
    if x.dtype.kind == "i":
        neg_val = np.where(x == 1, one, np.where(x == -1, np.where(odd, -one, one), 0))
    else:
        neg_val = np.where(x == 1, one, 0)
    return np.where(neg, neg_val, r).astype(x.dtype, copy=False)


# -- variadic ------------------------------------------------------------------------


def _variadic(name, reducer, *, mean=False):
    def kernel(k, *xs):
        xs = [x for x in xs if x is not None]
        if not xs:
            raise ValueError(f"{k.node.describe()}: needs at least one input")
        dt = xs[0].dtype
        for x in xs[1:]:
            if x.dtype != dt:
                raise TypeError(f"{k.node.describe()}: input types differ ({dt} and {x.dtype})")
        low = is_low_float(dt)
        if low:
            xs = [x.astype(_F32) for x in xs]
        if len(xs) == 1:
            r = xs[0] if low else xs[0].copy()
        else:
            # asarray: two rank-0 inputs give a numpy scalar, which cannot take out=
            r = np.asarray(reducer(xs[0], xs[1]))
            for x in xs[2:]:
                if x.shape == r.shape or np.broadcast_shapes(x.shape, r.shape) == r.shape:
                    reducer(r, x, out=r)
                else:
                    r = reducer(r, x)
        if mean:
            r = r / r.dtype.type(len(xs))
        return _cast_back(r, dt)

    kernel.__name__ = name
    kernel.__qualname__ = name
    kernel.__doc__ = f"ONNX {name} over any number of broadcast inputs."
    op(name, since=1)(kernel)


_variadic("Max", np.maximum)
_variadic("Min", np.minimum)
_variadic("Sum", np.add)
_variadic("Mean", np.add, mean=True)


# -- Clip ----------------------------------------------------------------------------


@op("Clip", since=1, end=10)
def clip_attrs(k, x, *, min=-np.inf, max=np.inf):  # noqa: A002 - the spec's names
    """ONNX Clip before opset 11: bounds are attributes."""
    return _clip(k, x, np.asarray(min, dtype=np.float64), np.asarray(max, dtype=np.float64))


@op("Clip", since=11)
def clip(k, x, lo=None, hi=None):
    """ONNX Clip from opset 11: bounds are optional scalar inputs."""
    return _clip(k, x, lo, hi)


def _clip(k, x, lo, hi):
    xp = k.xp
    dt = x.dtype
    low = is_low_float(dt)
    y = x.astype(_F32) if low else x
    for name, b in (("min", lo), ("max", hi)):
        if b is not None and np.size(b) != 1:
            raise ValueError(f"{k.node.describe()}: {name} must be a scalar, got shape {np.shape(b)}")
    if dt.kind == "f" or low:
        # an omitted bound is the type's lowest or largest finite value (the spec's
        # numeric_limits::lowest() and max()), so infinities are clamped to it, as
        # onnxruntime and the fused Conv + Clip do
        if lo is None:
            lo = _finite_limit(dt, low=True)
        if hi is None:
            hi = _finite_limit(dt, low=False)

    def bound(b):
        b = np.asarray(b).reshape(())
        if y.dtype.kind in "iu" and b.dtype.kind == "f":
            info = np.iinfo(y.dtype)
            b = np.clip(b, info.min, info.max)
        return b.astype(y.dtype)

    if xp is np and y.dtype.kind in "iuf":
        # one np.clip pass: numpy's maximum/minimum against a scalar are slower
        y = clamp(y, None if lo is None else bound(lo), None if hi is None else bound(hi))
    else:
        if lo is not None:
            y = xp.maximum(y, bound(lo))
        if hi is not None:
            y = xp.minimum(y, bound(hi))
    if y is x:
        return x.copy()
    return _cast_back(y, dt)


def _finite_limit(dt: np.dtype, low: bool) -> np.ndarray:
    """The lowest (``low``) or largest finite value of float type ``dt``."""
    try:
        info = np.finfo(dt)
    except (TypeError, ValueError):
        import ml_dtypes  # bfloat16 and the float8 family

        info = ml_dtypes.finfo(dt)
    return np.asarray(info.min if low else info.max)


# -- selection and classification ----------------------------------------------------


@op("Where", since=9)
def where(k, cond, x, y):
    """ONNX Where with numpy broadcasting."""
    if cond.dtype != np.bool_:
        cond = cond.astype(np.bool_)
    if x.dtype != y.dtype:
        raise TypeError(f"{k.node.describe()}: X and Y types differ ({x.dtype} and {y.dtype})")
    if not cond.shape == x.shape == y.shape:
        _check_broadcast(k, x.dtype, cond, x, y)
    if k.xp is np:
        return _blend_where(cond, x, y)
    return k.xp.where(cond, x, y)


def _float_view(x):
    return x.astype(_F32) if x.dtype.kind == "V" else x


@op("IsNaN", since=9)
def isnan(k, x):
    """ONNX IsNaN."""
    return k.xp.isnan(_float_view(x))


@op("IsInf", since=10)
def isinf(k, x, *, detect_positive=1, detect_negative=1):
    """ONNX IsInf; the attributes choose which infinities count."""
    xp = k.xp
    x = _float_view(x)
    if detect_positive and detect_negative:
        return xp.isinf(x)
    if detect_positive:
        return x == np.inf
    if detect_negative:
        return x == -np.inf
    return xp.zeros(x.shape, dtype=np.bool_)


# -- bitwise -------------------------------------------------------------------------


@op("BitShift", since=11)
def bit_shift(k, x, y, *, direction=""):
    """ONNX BitShift; shifts of the type's width or more (or negative) fill with the sign."""
    if direction not in ("LEFT", "RIGHT"):
        raise ValueError(f"{k.node.describe()}: direction must be 'LEFT' or 'RIGHT', got {direction!r}")
    if x.dtype != y.dtype:
        raise TypeError(f"{k.node.describe()}: input types differ ({x.dtype} and {y.dtype})")
    xp = k.xp
    bits = x.dtype.itemsize * 8
    valid = (y < bits) if y.dtype.kind == "u" else ((y >= 0) & (y < bits))
    ok = bool(valid.all())
    ys = y if ok else xp.where(valid, y, y.dtype.type(0))
    if direction == "LEFT":
        r = xp.left_shift(x, ys)
        return r if ok else xp.where(valid, r, x.dtype.type(0))
    r = xp.right_shift(x, ys)
    if ok:
        return r
    if x.dtype.kind == "i":
        fill = xp.where(x < 0, x.dtype.type(-1), x.dtype.type(0))
    else:
        fill = x.dtype.type(0)
    return xp.where(valid, r, fill)


def _register_bitwise(name, fn):
    def kernel(k, a, b):
        if a.dtype != b.dtype:
            raise TypeError(f"{k.node.describe()}: input types differ ({a.dtype} and {b.dtype})")
        return getattr(k.xp, fn)(a, b)

    kernel.__name__ = name
    kernel.__qualname__ = name
    kernel.__doc__ = f"ONNX {name}."
    op(name, since=18)(kernel)


_register_bitwise("BitwiseAnd", "bitwise_and")
_register_bitwise("BitwiseOr", "bitwise_or")
_register_bitwise("BitwiseXor", "bitwise_xor")


# -- linear algebra and scans --------------------------------------------------------


@op("Det", since=11)
def det(k, x):
    """ONNX Det over the last two dimensions (batched)."""
    if x.ndim < 2 or x.shape[-1] != x.shape[-2]:
        raise ValueError(f"{k.node.describe()}: input must be [..., M, M], got shape {x.shape}")
    dt = x.dtype
    y = np.linalg.det(upcast(x))
    return np.asarray(y).astype(dt, copy=False)


class _Scan(Kernel):
    """CumSum / CumProd along an axis given as an input."""

    ufunc = np.add
    identity = 0

    def setup(self):
        self.exclusive = bool(self.attrs.get("exclusive", 0))
        self.reverse = bool(self.attrs.get("reverse", 0))

    def run(self, x, axis):
        if np.size(axis) != 1:
            raise ValueError(f"{self.node.describe()}: axis must be a scalar, got shape {np.shape(axis)}")
        ax = int(np.asarray(axis).reshape(()))
        nd = x.ndim
        if not -nd <= ax < nd:
            raise ValueError(f"{self.node.describe()}: axis {ax} out of range for rank {nd}")
        ax %= nd
        dt = x.dtype
        xc = upcast(x)
        if self.reverse:
            xc = np.flip(xc, ax)
        acc = self.ufunc.accumulate(xc, axis=ax, dtype=xc.dtype)
        if self.exclusive:
            out = np.empty_like(acc)
            head = [slice(None)] * nd
            head[ax] = slice(0, 1)
            out[tuple(head)] = self.identity
            dst, src = list(head), list(head)
            dst[ax], src[ax] = slice(1, None), slice(0, -1)
            out[tuple(dst)] = acc[tuple(src)]
            acc = out
        if self.reverse:
            acc = np.ascontiguousarray(np.flip(acc, ax))
        return (_cast_back(acc, dt),)


@op("CumSum", since=11)
class CumSum(_Scan):
    """ONNX CumSum (exclusive / reverse attributes)."""

    ufunc = np.add
    identity = 0


@op("CumProd", since=26)
class CumProd(_Scan):
    """ONNX CumProd (exclusive / reverse attributes)."""

    ufunc = np.multiply
    identity = 1


def _einsum_shape(equation: str, xs) -> tuple | None:
    """The result shape of an explicit (``->``) einsum equation over ``xs``, or None
    where the equation does not fit them (``np.einsum`` then says why)."""
    lhs, rhs = equation.split("->")
    terms = lhs.split(",")
    if len(terms) != len(xs):
        return None
    dims: dict[str, int] = {}
    ell: tuple = ()
    for term, x in zip(terms, xs):
        letters = term.replace("...", "")
        n_ell = x.ndim - len(letters)
        if n_ell < 0 or (n_ell and "..." not in term):
            return None
        at = term.find("...")
        shape = list(x.shape)
        if at >= 0:
            ell_dims, shape = tuple(shape[at:at + n_ell]), shape[:at] + shape[at + n_ell:]
            try:
                ell = np.broadcast_shapes(ell, ell_dims)
            except ValueError:
                return None
        for c, d in zip(letters, shape):
            dims[c] = max(dims.get(c, 1), d) if d != 1 else dims.get(c, 1)
    out = []
    for part in rhs.split("...") if "..." in rhs else [rhs]:
        out.append([dims.get(c) for c in part])
    if any(d is None for part in out for d in part):
        return None
    return tuple(out[0]) + (tuple(ell) + tuple(out[1]) if len(out) > 1 else ())


@op("Einsum", since=12)
class Einsum(Kernel):
    """ONNX Einsum via ``np.einsum`` with contraction-order optimisation."""

    def setup(self):
        eq = self.attrs.get("equation")
        if eq is None:
            raise ValueError(f"{self.node.describe()}: equation is required")
        # an empty equation is a scalar's own (it gives the scalar, as in onnxruntime)
        eq = eq.replace(" ", "")
        if "->" not in eq:
            # implicit output: labels seen once, in ASCII order, after any ellipsis dims
            letters = [c for c in eq if c.isalpha()]
            once = sorted(c for c in set(letters) if letters.count(c) == 1)
            eq = eq + "->" + ("..." if "..." in eq else "") + "".join(once)
        self.equation = eq

    def run(self, *xs):
        dt = xs[0].dtype
        bound = dt.itemsize
        for x in xs:
            for d in x.shape:
                bound *= max(d, 1)  # [N, 0] and [0, N] still make N * N
        if bound > allocation_limit():
            # the result's labels are the inputs' (an outer product multiplies their sizes)
            shape = _einsum_shape(self.equation, xs)
            if shape is not None:
                check_allocation(shape, _F32 if is_low_float(dt) else dt, "Einsum output")
        ops = [upcast(x) for x in xs]
        y = np.einsum(self.equation, *ops, optimize=True)
        y = np.asarray(y)
        if any(y is x for x in xs):
            y = y.copy()
        return (_cast_back(y, dt),)
