"""The CPU provider's compiled kernels, where they were built.

Some work costs numpy one call per small array, or one pass over memory per tap,
where a compiled loop does it in one pass in cache (depthwise convolutions, the
gathered columns of a convolution and its bias and activation); and work that
Python threads share pays a GIL hand-over per chunk. ``onnxrt-cpu`` compiles
``native/src/*.c`` at install time into one optional extension module,
``_kernels``: its kernels release the GIL and share their chunks on a thread pool
of their own, and multiply through the BLAS library numpy uses (whose ``sgemm`` and
``dgemm`` are found in the process and handed to the module here). With no C
compiler the install still succeeds and every kernel keeps its numpy path, which
computes the same results.

``ONNXRT_CPU_NATIVE=0`` in the environment turns the compiled kernels off (the numpy
paths run); ``ONNXRT_CPU_SPIN_US`` sets how long an idle pool worker waits, spinning,
for the next kernel before it sleeps (200 us by default). :func:`status` says what
is loaded and why anything is not.
"""

from __future__ import annotations

import ctypes
import functools
import importlib
import os
from collections import namedtuple
from types import ModuleType

import numpy as np
from onnxrt.run.threads import current_thread_count

__all__ = ["K", "BLAS", "RELU", "CLIP", "SIGMOID", "SWISH", "GELU", "ConvGeometry", "Int8Weights", "NBitsWeights",
           "WindowGeometry", "conv_geometry", "kernels", "window_geometry",
           "blas_ready", "channel_affine", "float_range", "int8_blocks", "int8_matmul", "layer_norm", "nbits_matmul",
           "pack_conv_int8", "pack_int8_weights", "pack_nbits_weights", "pair_lookup", "rms_norm", "status", "unary"]

_module: ModuleType | None = None
_reason: str | None = None
_blas: str | None = None  # the library the products call, or None
_blas_reason: str | None = None
_loaded = False

#: CBLAS symbols by preference: (sgemm, dgemm, 64-bit integers)
_SYMBOLS = (
    ("scipy_cblas_sgemm64_", "scipy_cblas_dgemm64_", True),
    ("cblas_sgemm64_", "cblas_dgemm64_", True),
    ("scipy_cblas_sgemm", "scipy_cblas_dgemm", False),
    ("cblas_sgemm", "cblas_dgemm", False),
)


#: The fields of :class:`WindowGeometry` and :class:`ConvGeometry`, in the order of
#: the compiled kernels' structs (native.h), which check them when they are loaded.
_WINDOW_FIELDS = ("n", "c", "h", "w", "kh", "kw", "sh", "sw", "dh", "dw", "pad_top", "pad_left", "oh", "ow")
_CONV_FIELDS = _WINDOW_FIELDS[:4] + ("m", "groups") + _WINDOW_FIELDS[4:]


class WindowGeometry(namedtuple("WindowGeometry", _WINDOW_FIELDS)):
    """A window over 2-D planes for the compiled depthwise convolution and pooling
    (``depthwise2d``, ``pool2d``), every field an int: ``n`` images of ``c`` planes
    ``h`` x ``w``, a ``kh`` x ``kw`` window, its strides ``sh``, ``sw`` and dilations
    ``dh``, ``dw``, the pads before each axis (``pad_top``, ``pad_left``) and the
    output size ``oh`` x ``ow``. The kernels take this type only."""

    __slots__ = ()


class ConvGeometry(namedtuple("ConvGeometry", _CONV_FIELDS)):
    """A 2-D convolution's geometry for the compiled convolutions (``conv2d``,
    ``qconv2d``, ``qconv8``, ``direct2d``, ``qdirect2d``, ``winograd3x3``):
    :class:`WindowGeometry`'s fields and, after ``w``, the output channels ``m`` and
    the ``groups``. The kernels take this type only."""

    __slots__ = ()

    def window(self) -> WindowGeometry:
        """The window of this convolution over each plane (a depthwise one's)."""
        return window_geometry((self.n, self.c, self.h, self.w), (self.kh, self.kw), (self.sh, self.sw),
                               (self.dh, self.dw), (self.pad_top, self.pad_left), (self.oh, self.ow))


@functools.lru_cache(maxsize=512)
def conv_geometry(shape, m: int, groups: int, kernel, strides, dilations, pads, out) -> ConvGeometry:
    """The :class:`ConvGeometry` of a convolution of an input ``shape`` ``(N, C, H, W)``
    into ``m`` channels in ``groups`` groups, from the ``(rows, columns)`` pairs of its
    ``kernel``, ``strides``, ``dilations``, ``pads`` before each axis and ``out`` size
    (every argument an int or a tuple). Kept per layout: named, a geometry costs 1-2
    us to build, on every call of every layer."""
    (n, c, h, w), (kh, kw), (sh, sw), (dh, dw), (pt, pl), (oh, ow) = shape, kernel, strides, dilations, pads, out
    return ConvGeometry(n=n, c=c, h=h, w=w, m=m, groups=groups, kh=kh, kw=kw, sh=sh, sw=sw, dh=dh, dw=dw, pad_top=pt,
                        pad_left=pl, oh=oh, ow=ow)


@functools.lru_cache(maxsize=512)
def window_geometry(shape, kernel, strides, dilations, pads, out) -> WindowGeometry:
    """The :class:`WindowGeometry` of a window over the planes of an input ``shape``
    ``(N, C, H, W)``, its other arguments as :func:`conv_geometry`'s (kept per layout
    too)."""
    (n, c, h, w), (kh, kw), (sh, sw), (dh, dw), (pt, pl), (oh, ow) = shape, kernel, strides, dilations, pads, out
    return WindowGeometry(n=n, c=c, h=h, w=w, kh=kh, kw=kw, sh=sh, sw=sw, dh=dh, dw=dw, pad_top=pt, pad_left=pl,
                          oh=oh, ow=ow)


def _disabled() -> bool:
    return os.environ.get("ONNXRT_CPU_NATIVE", "1").strip().lower() in ("0", "false", "no", "off")


def _numpy_blas_libraries() -> list[str]:
    """Paths of the BLAS libraries loaded in this process, numpy's first."""
    from threadpoolctl import threadpool_info

    libs = [i["filepath"] for i in threadpool_info() if i.get("user_api") == "blas" and i.get("filepath")]
    root = os.path.dirname(os.path.dirname(np.__file__))
    return sorted(libs, key=lambda p: not os.path.realpath(p).startswith(os.path.realpath(root)))


def _hand_over_blas(module: ModuleType) -> tuple[str | None, str | None]:
    """Find numpy's CBLAS products, give them to ``module`` and check one product of
    each against numpy: (the library, None) or (None, why not)."""
    np.dot(np.ones((2, 2)), np.ones((2, 2)))  # numpy loads its BLAS lazily on some builds
    for path in _numpy_blas_libraries():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for s_name, d_name, wide in _SYMBOLS:
            try:
                s_fn, d_fn = getattr(lib, s_name), getattr(lib, d_name)
            except AttributeError:
                continue
            s_addr = ctypes.cast(s_fn, ctypes.c_void_p).value
            d_addr = ctypes.cast(d_fn, ctypes.c_void_p).value
            module.set_blas(s_addr, d_addr, wide)
            if _products_agree(module):
                return path, None
            module.set_blas(0, 0, False)  # cleared: the convolutions stay numpy's
            return None, f"{s_name} in {os.path.basename(path)} gave a wrong product"
    return None, "no CBLAS sgemm/dgemm found in numpy's BLAS library"


def _products_agree(module: ModuleType) -> bool:
    """A small convolution through the handed-over products against numpy."""

    # fixed irregular values, not numpy.random: importing it (and the OpenSSL its
    # seeding loads) costs a process 4 MiB resident that a session never needs
    for dt in (np.float32, np.float64):
        x = np.sin(np.arange(105) * 0.7 + 0.3).reshape(1, 3, 5, 7).astype(dt)
        w = np.cos(np.arange(12) * 1.3 + 0.1).reshape(4, 3).astype(dt)
        y = np.empty((1, 4, 5, 7), dt)
        geometry = ConvGeometry(n=1, c=3, h=5, w=7, m=4, groups=1, kh=1, kw=1, sh=1, sw=1, dh=1, dw=1, pad_top=0,
                                pad_left=0, oh=5, ow=7)
        module.conv2d(x, w, None, None, y, geometry, 0, 0.0, 0.0, 1)
        want = np.einsum("mc,nchw->nmhw", w.astype(np.float64), x.astype(np.float64))
        if not np.allclose(y, want, rtol=1e-5, atol=1e-5):
            return False
    return True


def _load() -> None:
    global _module, _reason, _blas, _blas_reason, _loaded
    _loaded = True
    if _disabled():
        _reason = "turned off by ONNXRT_CPU_NATIVE=0"
        return
    try:
        module = importlib.import_module(f"{__name__}._kernels")
    except ImportError as e:
        _reason = f"not built ({e})"
        return
    try:
        module.set_geometry_types(ConvGeometry, WindowGeometry)
    except (AttributeError, TypeError) as e:  # a stale build: its kernels would misread the geometry
        _reason = f"the built module does not take this package's geometry types ({e})"
        return
    spin = os.environ.get("ONNXRT_CPU_SPIN_US")
    if spin is not None:
        try:
            module.set_spin(float(spin))
        except ValueError as e:
            _reason = f"ONNXRT_CPU_SPIN_US={spin!r}: {e}"
            return
    try:
        _blas, _blas_reason = _hand_over_blas(module)
    except Exception as e:  # pragma: no cover - an unusual BLAS setup: the products stay numpy's
        _blas, _blas_reason = None, f"{type(e).__name__}: {e}"
    # without numpy's products the convolutions stay numpy's; kernels that need no
    # BLAS (depthwise) still run compiled
    _module = module
    # the pool's workers spin between the kernels of a run; when no run is in
    # progress they sleep at once instead of taking cores from the application
    from onnxrt.run.threads import add_idle_hook

    add_idle_hook(module.pool_rest)


def kernels() -> ModuleType | None:
    """The compiled module, or None where it was not built, failed to load, or
    ``ONNXRT_CPU_NATIVE=0`` turns it off."""
    if not _loaded:
        _load()
    return _module


def blas_ready() -> bool:
    """Whether the compiled kernels multiply through numpy's BLAS (the compiled
    convolutions need it)."""
    return kernels() is not None and _blas is not None


def status() -> dict:
    """``{"loaded", "reason", "blas", "blas_reason", "int8_products", "pool", "ufuncs"}``:
    whether the compiled kernels are loaded (else why not), the BLAS library their
    products call (else why none), whether this CPU runs the 8-bit products (AVX-512
    VNNI), the thread pool's workers and spin time, and whether the numpy ufuncs
    (Relu's one-operand form) are loaded."""
    module = kernels()
    return {
        "loaded": module is not None,
        "reason": _reason,
        "blas": _blas,
        "blas_reason": _blas_reason if module is not None else _reason,
        "int8_products": module is not None and module.igemm_ready(),
        "pool": module.pool_info() if module is not None else None,
        "ufuncs": RELU_UFUNC is not None,
    }


#: The compiled module, or None (kernels read it at call time, so a test can set it
#: to None to run the numpy paths).
K: ModuleType | None = kernels()


def _load_ufuncs() -> ModuleType | None:
    """``_ufuncs`` (numpy ufuncs built against numpy's headers), or None where it was
    not built, the numpy here cannot load it, or the compiled kernels are turned off."""
    if _disabled():
        return None
    try:
        from . import _ufuncs as module
    except ImportError:
        return None
    return module


#: Relu as a one-operand numpy ufunc (``relu(x)`` is ``np.maximum(x, 0)``), or None.
RELU_UFUNC = getattr(_load_ufuncs(), "relu", None)

#: Whether :data:`K`'s products go through numpy's BLAS (its convolutions need it).
BLAS: bool = blas_ready()


#: ``unary`` ops
RELU, CLIP, SIGMOID, SWISH, GELU = 1, 2, 3, 4, 5

#: Elements from which Relu and Clip go to the compiled kernel: below this, numpy's
#: one ufunc call costs no more than the compiled one.
UNARY_MIN = 4096
#: The ops numpy computes in several passes (exp, add, divide; erf): the compiled
#: kernel's one call is the cheaper from the first element (a Sigmoid of one value:
#: 0.16 against 3.8 us)
_MULTI_PASS = frozenset((SIGMOID, SWISH, GELU))


def unary(x, op: int, alpha: float = 0.0, beta: float = 0.0, bias=None):
    """``op(x)`` (:data:`RELU`, :data:`CLIP` to ``[alpha, beta]``, :data:`SIGMOID`,
    :data:`SWISH` ``x * sigmoid(alpha * x)``, :data:`GELU` in its erf form) by the
    compiled kernel, one pass split
    over the run's threads; None where it does not take ``x`` (not loaded, or not a
    C-contiguous float32 numpy array of at least one element, :data:`UNARY_MIN` for
    Relu and Clip). With a
    ``bias`` (a float32 vector as long as ``x``'s last axis) the op applies to ``x +
    bias``, added in the same pass (BiasGelu)."""
    k = K
    # the size first: most calls of small models stop here, at the cost of two lookups
    if k is None or type(x) is not np.ndarray or x.size < (1 if op in _MULTI_PASS else UNARY_MIN) \
            or x.dtype != np.float32 or not x.flags.c_contiguous or x.ndim == 0:
        return None
    if bias is not None:
        if type(bias) is not np.ndarray or bias.dtype != np.float32 or bias.shape != x.shape[-1:]:
            return None
        bias = np.ascontiguousarray(bias)
    y = np.empty_like(x)
    k.unary(x, y, op, float(alpha), float(beta), current_thread_count(), bias)
    return y


def channel_affine(x, a, s):
    """``x * a[c] + s[c]`` over the channel axis 1 of ``x`` (inference
    BatchNormalization) by the compiled kernel, one pass split
    over the run's threads; None where it does not take ``x`` (not loaded, not a
    C-contiguous float32/64 numpy array of rank 2 or more, or ``a`` and ``s`` not
    ``[C]`` vectors of its type)."""
    k = K
    if k is None or type(x) is not np.ndarray or x.dtype not in (np.float32, np.float64) or x.ndim < 2 \
            or x.size == 0 or not x.flags.c_contiguous:
        return None
    c = x.shape[1]
    a = np.ascontiguousarray(a, dtype=x.dtype).reshape(-1)
    s = np.ascontiguousarray(s, dtype=x.dtype).reshape(-1)
    if a.shape != (c,) or s.shape != (c,):
        return None
    y = np.empty_like(x)
    inner = x.size // (x.shape[0] * c)
    k.channel_affine(x, a, s, y, c, inner, current_thread_count())
    return y


def _f32_rows(x) -> bool:
    return type(x) is np.ndarray and x.dtype == np.float32 and x.flags.c_contiguous and x.ndim >= 1


def rms_norm(x, gamma, eps: float, skip=None, bias=None, want_sum: bool = False, want_inv: bool = False):
    """RMS normalization over the last axis of ``x`` (Simplified and SkipSimplified
    LayerNormalization) by the compiled kernel, one pass a row: ``s = x + skip + bias``,
    ``y = s / sqrt(mean(s^2) + eps) * gamma``. Returns ``(y, s or None, inv or None)``
    (``inv`` shaped ``x.shape[:-1]``), or None where it does not take the arrays (not
    loaded; not C-contiguous float32; ``skip`` not ``x``'s shape; ``gamma``/``bias``
    not ``[h]``)."""
    done = _row_norm(x, gamma, None, eps, skip, bias, want_sum, False, want_inv, center=False)
    return None if done is None else (done[0], done[1], done[3])


def layer_norm(x, gamma, beta, eps: float, skip=None, bias=None, want_sum: bool = False,
               want_stats: bool = False):
    """Layer normalization over the last axis of ``x`` (LayerNormalization,
    SkipLayerNormalization, EmbedLayerNormalization) by the compiled kernel: ``s = x +
    skip + bias``, ``y = (s - mean(s)) / sqrt(var(s) + eps) * gamma + beta``. Returns
    ``(y, s or None, mean or None, inv or None)`` (the statistics shaped
    ``x.shape[:-1]``, given with ``want_stats``), or None where it does not take the
    arrays (as :func:`rms_norm`; ``beta`` ``[h]`` or None)."""
    return _row_norm(x, gamma, beta, eps, skip, bias, want_sum, want_stats, want_stats, center=True)


def _row_norm(x, gamma, beta, eps, skip, bias, want_sum, want_mean, want_inv, center):
    k = K
    if k is None or not _f32_rows(x) or x.size == 0:
        return None
    h = x.shape[-1]
    if not _f32_rows(gamma) or gamma.shape != (h,) or (skip is not None and (not _f32_rows(skip) or
                                                                             skip.shape != x.shape)) \
            or (bias is not None and (not _f32_rows(bias) or bias.shape != (h,) or skip is None)) \
            or (beta is not None and (not _f32_rows(beta) or beta.shape != (h,))):
        return None
    y = np.empty_like(x)
    s = np.empty_like(x) if want_sum and skip is not None else None
    mean = np.empty(x.shape[:-1], np.float32) if want_mean else None
    inv = np.empty(x.shape[:-1], np.float32) if want_inv else None
    k.row_norm(x, skip, bias, gamma, beta, y, s, mean, inv, float(eps), center, current_thread_count())
    return y, (x if want_sum and skip is None else s), mean, inv


def float_range(x) -> tuple[float, float] | None:
    """``(x.min(), x.max())`` of a C-contiguous float32 array of at least one value, as
    Python floats, in one compiled pass (both NaN where ``x`` holds a NaN); None where
    the kernels are not loaded or ``x`` is not such an array."""
    k = K
    if k is None or not _f32_rows(x) or x.size == 0:
        return None
    return k.float_range(x)


def pair_lookup(a, b, table) -> np.ndarray | None:
    """``table[a << 8 | b]`` over the raw bytes of two 8-bit arrays of one shape, in one
    compiled pass (QLinearAdd's and QLinearMul's table of every pair of codes):
    a new array of ``table``'s type and ``a``'s shape, or None where the kernels are
    not loaded or the arrays are not such (C-contiguous, 8-bit, 65,536 entries)."""
    k = K
    if k is None or type(a) is not np.ndarray or type(b) is not np.ndarray or a.shape != b.shape \
            or a.dtype.itemsize != 1 or b.dtype.itemsize != 1 or a.dtype.kind not in "iu" \
            or b.dtype.kind not in "iu" or not a.flags.c_contiguous or not b.flags.c_contiguous \
            or table.shape != (65536,) or table.dtype.itemsize != 1 or table.dtype.kind not in "iu":
        return None
    out = np.empty(a.shape, table.dtype)
    k.pair_lookup(a, b, table, out, current_thread_count())
    return out


def int8_blocks(a, block: int):
    """MatMulNBits' rounding of A to int8 per block of ``block`` values along the last
    axis (float32, bit for bit the numpy path's) by the compiled kernel, in one pass;
    None where it does not take ``a``."""
    k = K
    if k is None or not _f32_rows(a) or a.size == 0:
        return None
    y = np.empty_like(a)
    k.int8_blocks(a, y, a.shape[-1], int(block))
    return y


#: Longest inner dimension of the 8-bit products: every sum of 255 x 255 products
#: then fits int32.
INT8_MAX_K = 33024
#: Multiply-adds of an 8-bit product a thread takes at least: below it a hand-over to
#: the pool costs more than it saves (BERT-tiny's 256 x 32 x 32 products, 5 us on one
#: thread, ran slower in a session on two).
INT8_THREAD_MACS = 1 << 19


class Int8Weights:
    """A constant 8-bit B [K, N] packed for :func:`int8_matmul` (see igemm.c): its
    values as int8 in panels of 16 columns by 4 rows, and its zero points and column
    sums after that shift, as int32 vectors padded to whole pairs of panels."""

    __slots__ = ("packed", "zb", "colsum", "k", "n")

    def __init__(self, packed, zb, colsum, k: int, n: int):
        self.packed, self.zb, self.colsum, self.k, self.n = packed, zb, colsum, k, n


def _int8_domain(values, zero_point, count: int):
    """``values`` (uint8 or int8) as int8, uint8 shifted by -128 (the 8-bit kernels'
    signed operand), and their zero point (None, one value, or ``count`` values in a
    vector, of ``values``' type) as int32 ``[count]`` in the same domain; None where
    the zero point is not such (the numpy path reports it)."""
    zp = np.zeros(count, np.int32)
    if zero_point is not None:
        z = np.asarray(zero_point)
        if z.dtype != values.dtype or z.size not in (1, count) or (z.size == count != 1 and z.ndim != 1):
            return None
        zp[:] = z.reshape(-1).astype(np.int32)
    if values.dtype == np.uint8:
        return (values ^ np.uint8(0x80)).view(np.int8), zp - 128
    return values, zp


def pack_int8_weights(b, zero_point=None) -> Int8Weights | None:
    """``b`` (a 2-D uint8 or int8 array) and its zero point (None, one value, or one
    per column) packed for :func:`int8_matmul`; None where this CPU has no 8-bit
    products, or they do not take ``b``."""
    k = K
    if k is None or not k.igemm_ready() or type(b) is not np.ndarray or b.ndim != 2 \
            or b.dtype not in (np.uint8, np.int8) or not 1 <= b.shape[0] <= INT8_MAX_K or b.shape[1] < 1:
        return None
    rows, cols = b.shape
    signed = _int8_domain(b, zero_point, cols)
    if signed is None:
        return None
    k4, npad = -(-rows // 4) * 4, -(-cols // 32) * 32
    full = np.zeros((k4, npad), np.int8)
    full[:rows, :cols] = signed[0]
    packed = np.ascontiguousarray(full.reshape(k4 // 4, 4, npad // 16, 16).transpose(2, 0, 3, 1))
    zb = np.zeros(npad, np.int32)
    zb[:cols] = signed[1]
    colsum = np.zeros(npad, np.int32)
    colsum[:cols] = full[:, :cols].sum(axis=0, dtype=np.int32)
    return Int8Weights(packed, zb, colsum, rows, cols)


def pack_conv_int8(w, zero_point=None) -> tuple[np.ndarray, np.ndarray] | None:
    """A QLinearConv weight ``w`` [M, C / groups, *kernel] (int8 or uint8) and its zero
    point (scalar or one a channel, ``w``'s type, or None) for ``K.qconv8``: the rows as
    int8 [M, kp] (uint8 shifted by -128; zeros from the row's length to kp, a multiple
    of 4) and the zero points in the same domain (int32 [M]). None where this CPU has
    no 8-bit convolution, or the arrays are not such."""
    k = K
    if k is None or not k.igemm_ready() or type(w) is not np.ndarray or w.dtype not in (np.int8, np.uint8) \
            or w.ndim < 3 or 0 in w.shape:
        return None
    m = w.shape[0]
    rows = w.reshape(m, -1)
    if rows.shape[1] > INT8_MAX_K:
        return None  # (the kernel's int32 corrections stay exact up to this)
    signed = _int8_domain(rows, zero_point, m)
    if signed is None:
        return None
    rows, zw = signed
    kp = (rows.shape[1] + 3) // 4 * 4
    w8 = np.zeros((m, kp), np.int8)
    w8[:, : rows.shape[1]] = rows
    return w8, zw


class NBitsWeights:
    """A MatMulNBits weight packed for :func:`nbits_matmul`: the centred values as
    int8 panels (:func:`pack_int8_weights`'s layout), each block's column sums and
    scales ``[blocks, columns padded]``."""

    def __init__(self, packed, colsum, scale, k, n, block):
        self.packed, self.colsum, self.scale = packed, colsum, scale
        self.k, self.n, self.block = k, n, block


def pack_nbits_weights(centred, scales, k: int, block: int) -> NBitsWeights | None:
    """``centred`` (int8 ``[N, blocks * block]``: a 4-bit weight's codes minus their
    zero points, zeros past ``k``) and ``scales`` (``[N, blocks]``) packed for
    :func:`nbits_matmul`; None where this CPU has no 8-bit products."""
    if type(centred) is not np.ndarray or centred.dtype != np.int8 or centred.ndim != 2 or block % 4:
        return None
    n, kp = centred.shape
    nb = kp // block
    if nb * block != kp or scales.shape != (n, nb):
        return None
    # (None where this CPU has no 8-bit products, or the rows pass INT8_MAX_K)
    w = pack_int8_weights(np.ascontiguousarray(centred.T))
    if w is None:
        return None
    npad = -(-n // 32) * 32
    colsum = np.zeros((nb, npad), np.int32)
    colsum[:, :n] = centred.reshape(n, nb, block).sum(axis=2, dtype=np.int32).T
    scale = np.zeros((nb, npad), np.float32)
    scale[:, :n] = scales.T
    return NBitsWeights(w.packed, colsum, scale, k, n, block)


def nbits_matmul(a, w: NBitsWeights, bias=None):
    """MatMulNBits at accuracy_level 4 by the compiled 8-bit kernel: ``a`` [..., K]
    float32 rounded to int8 per block, its product with the 4-bit weight in integers
    a block at a time, scaled and summed in float32, plus ``bias`` ([N] float32 or
    None): float32 [..., N], or None where the kernel does not take the arrays."""
    k = K
    if k is None or type(a) is not np.ndarray or a.dtype != np.float32 or a.ndim == 0 or a.shape[-1] != w.k:
        return None
    if bias is not None and (type(bias) is not np.ndarray or bias.dtype != np.float32 or bias.shape != (w.n,)):
        return None
    x = np.ascontiguousarray(a).reshape(-1, w.k)
    out = np.empty((x.shape[0], w.n), np.float32)
    threads = min(current_thread_count(), 1 + x.shape[0] * w.k * w.n // INT8_THREAD_MACS)
    k.nbits_matmul(x, w.packed, w.colsum, w.scale, bias, out, (x.shape[0], w.k, w.n, w.block), threads)
    return out.reshape(a.shape[:-1] + (w.n,))


def int8_matmul(a, w: Int8Weights, a_zero_point: int = 0, a_scale=None, scale=None, bias=None,
                y_zero_point=None, y_type=None):
    """``(a - a_zero_point) @ (B - B's zero point)`` for the B that ``w`` packs, exact in
    int32 (AVX-512 VNNI), ``a`` [..., K] of uint8 or int8, or of float32 quantized first
    as DynamicQuantizeLinear does with ``a_scale`` (a positive float32) and
    ``a_zero_point``. int32 out, or float32 where ``a_scale``, ``scale`` or ``bias`` is
    given: the sums converted, times ``scale`` (float32 [N] or [1]) and plus ``bias``
    (float32 [N]), each rounded as numpy rounds them. With ``y_type`` (np.uint8 or
    np.int8) and ``y_zero_point``, 8-bit out, requantized as QLinearMatMul: the sums
    times ``scale``, rounded half to even, plus ``y_zero_point``, saturated. None where
    the kernel does not take the arguments, or float ``a`` holds a NaN."""
    k = K
    if k is None or type(a) is not np.ndarray or a.ndim == 0 or a.shape[-1] != w.k:
        return None
    if a_scale is None and a.dtype not in (np.uint8, np.int8) or a_scale is not None and a.dtype != np.float32:
        return None
    if scale is not None and (type(scale) is not np.ndarray or scale.dtype != np.float32
                              or scale.shape not in ((w.n,), (1,))):
        return None
    if bias is not None and (type(bias) is not np.ndarray or bias.dtype != np.float32 or bias.shape != (w.n,)):
        return None
    if y_type is not None and (y_type not in (np.uint8, np.int8) or scale is None or bias is not None
                               or a_scale is not None):
        return None
    x = np.ascontiguousarray(a).reshape(-1, w.k)
    floats = a_scale is not None or scale is not None or bias is not None
    out = np.empty((x.shape[0], w.n), y_type if y_type is not None else np.float32 if floats else np.int32)
    threads = min(current_thread_count(), 1 + x.shape[0] * w.k * w.n // INT8_THREAD_MACS)
    if not k.igemm(x, float(a_scale) if a_scale is not None else 0.0, int(a_zero_point), w.packed, w.zb, w.colsum,
                   scale, bias, out, (x.shape[0], w.k, w.n, w.k), threads,
                   None if y_type is None else int(y_zero_point or 0)):
        return None
    return out.reshape(a.shape[:-1] + (w.n,))
