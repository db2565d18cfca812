"""The convolutions of the compiled kernels (``onnxrt_cpu.native``): which of them
takes a layer (Winograd's F(2x2, 3x3), the direct kernel, im2col in cache-sized
tiles, the depthwise kernel) and the call, 2-D maps (a 1-D one as one row) of
float32 or float64, and QLinearConv's 8-bit convolutions."""

from __future__ import annotations

import numpy as np

from .. import native, parallel

__all__ = ["WINOGRAD_MIN_CHANNELS", "NativeCall", "conv_native", "depthwise_native", "direct_pays", "native_call",
           "native_geometry", "planes", "qlinear_conv_native", "winograd_pays"]

_NATIVE_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))

#: Fewest output positions a side, and input times output channels, for which a 3x3
#: convolution takes Winograd's F(2x2, 3x3) (:func:`winograd_pays`).
_WINOGRAD_MIN_SIDE = 12
WINOGRAD_MIN_CHANNELS = 64 * 64


#: Longest reduction (input channels times taps) a convolution takes the compiled
#: direct kernel for (:func:`direct_pays`).
_DIRECT_MAX_K = 300


#: Fewest output positions of a map the direct kernel takes: it runs every image as
#: two pool jobs, which on small maps cost more than the work (QDQ ResNet-style
#: model, batch 8, a 3x3/2 layer of 32 -> 64 channels to 4 x 4: 103 -> 510 us).
_DIRECT_MIN_POSITIONS = 400

#: Longest reduction the float convolutions take the direct kernel for on maps of at
#: least :data:`_DIRECT_WIDE_POSITIONS` outputs and 4 rows (``direct_pays(wide=True)``).
#: One thread, the two kernels alternating, fastest of 35-1100 runs each (a loaded
#: machine): PLCMOS's 64 -> 128 3x3 dilated (2, 1) at 496 x 16 (K 576) 46.8 -> 43.1
#: ms, AECMOS's 48 -> 96 3x3 at 100 x 80 (K 432) 15.6 -> 11.0, 32 -> 64 5x5 at 64 x 64
#: (K 800) 5.0 -> 4.0, 96 -> 96 3x3 dilated at 50 x 40 (K 864) 3.7 -> 3.3, 128 -> 128
#: 3x3 dilated at 40 x 40 (K 1152) 5.3 -> 5.0; on two threads 46.8 ms tied, the
#: others 0.83-0.96 of the time. Below 1600 positions the row bands split too short
#: for two threads (64 -> 128 3x3/2 to 28 x 28: 854 -> 1084 us), and a reduction of
#: 2304 (256 channels 3x3) lost on one thread. Only for inputs of at most 4M values
#: (16 MB), whose padded copy the kernel writes whole before it starts: DNSMOS P.835's
#: 64 -> 32 3x3 at 300 x 161 (12 MB) 44.9 -> 33.5 ms, but at its 900 x 161 (37 MB)
#: 72.1 -> 79.4 ms.
_DIRECT_WIDE_K = 1200
_DIRECT_WIDE_POSITIONS = 1600
_DIRECT_WIDE_INPUT = 4 << 20


def direct_pays(x4, wp, kernel, out_sp, wide: bool = False) -> bool:
    """Whether the compiled direct kernel takes this layer: float32, group 1, not 1x1,
    a reduction of at most 300 (input channels times taps), at most 16 output
    channels or at least 8 input channels, and maps of at least 400 outputs. There im2col's product is short and
    narrow and runs far below BLAS's peak; the direct kernel keeps four output channels
    by 64 positions in registers. One thread: the YOLO-style detector's stem (8 x 3,
    3x3/2 at 320 x 320) 345 -> 239 us, 8 x 8 3x3 at 80 x 80 235 -> 122, 32 x 32 3x3 at
    40 x 40 462 -> 334; but 32 x 3 3x3/2 at 224 x 224 490 -> 562 (left to im2col).
    With ``wide`` (the float convolutions), also reductions of up to 1200 on maps of
    at least 1600 outputs in 4 rows or more from inputs of at most 4M values
    (:data:`_DIRECT_WIDE_K`), where it saves
    im2col's gather and its own products ran 5-30 % faster than the tiles' BLAS calls."""
    m, c = wp.shape[:2]
    if x4.dtype != np.float32 or wp.group != 1 or kernel == (1, 1) or not (m <= 16 or c >= 8):
        return False
    k, positions = c * kernel[0] * kernel[1], out_sp[0] * out_sp[1]
    if k <= _DIRECT_MAX_K:
        return positions >= _DIRECT_MIN_POSITIONS
    return (wide and k <= _DIRECT_WIDE_K and positions >= _DIRECT_WIDE_POSITIONS and out_sp[0] >= 4
            and x4.size <= _DIRECT_WIDE_INPUT)


def winograd_pays(x4, wp, kernel, strides, dilations, out_sp) -> bool:
    """Whether the compiled F(2x2, 3x3) kernel takes this layer: float32, group 1, 3x3,
    stride 1, no dilation, maps of at least 12 x 12 outputs and at least 64 x 64
    channels. It multiplies 2.25 times less than im2col does, in 16 products of [M, C]
    x [C, tiles], plus additions for its transforms: ResNet-18's 3x3 layers on two
    threads, 64 x 56 x 56 1526 -> 1045 us, 128 x 28 x 28 1534 -> 930, 256 x 14 x 14
    1569 -> 736; but 512 x 7 x 7 (16 tiles) 1905 -> 2101 and 32 x 32 channels at 40 x
    40 441 -> 506 on one thread, whose products are too narrow for BLAS. Results agree
    with the direct convolution to about 1e-6 relative (the transforms' coefficients
    are 0, +-1 and +-1/2)."""
    return (x4.dtype == np.float32 and wp.group == 1 and kernel == (3, 3) and strides == (1, 1)
            and dilations == (1, 1) and min(out_sp) >= _WINOGRAD_MIN_SIDE
            and wp.shape[0] * wp.shape[1] >= WINOGRAD_MIN_CHANNELS)


def planes(x, m: int, group: int, kernel, strides, dilations, pb, out_sp):
    """``(x as [N, C, H, W], its ConvGeometry)`` for the compiled kernels, a 1-D
    convolution (``x`` of rank 3) as a 2-D one of one row; None for other ranks. The
    geometry's arguments are tuples."""
    if x.ndim == 4:
        x4 = np.ascontiguousarray(x)
        if x4.shape[3] == 1 and kernel[1] == 1 and out_sp[1] == 1 and pb[1] == 0 and x4.shape[2] > 1:
            # A 1-D convolution along the rows of one-column planes (Magika's [N, C,
            # 512, 1] by a 5x1 kernel) as one along a row: the same memory, but
            # im2col copies each tap's runs of output positions whole where it
            # took them one value per output row (Magika's 512 x 256 x 5 layer on
            # two threads: 10.4 -> 6.9 ms)
            x4 = x4.reshape(x4.shape[0], x4.shape[1], 1, x4.shape[2])
            kernel, strides, dilations = (1, kernel[0]), (1, strides[0]), (1, dilations[0])
            pb, out_sp = (0, pb[0]), (1, out_sp[0])
    elif x.ndim == 3:
        x4 = np.ascontiguousarray(x).reshape(x.shape[0], x.shape[1], 1, x.shape[2])
        kernel, strides, dilations, pb, out_sp = (1, *kernel), (1, *strides), (1, *dilations), (0, *pb), (1, *out_sp)
    else:
        return None
    return x4, native.conv_geometry(x4.shape, m, group, kernel, strides, dilations, pb, out_sp)


def native_geometry(x, wp, strides, dilations, pb, pe, out_sp, pad_value):
    """:func:`planes` of a float convolution with the packed weight ``wp``; None where
    the compiled kernels do not take the layer (3-D and more, a padding value other
    than 0, negative pads, a dtype other than float32/64, an empty output)."""
    if native.K is None or pad_value != 0 or x.dtype not in _NATIVE_FLOATS or min(pb) < 0 or min(pe) < 0 \
            or 0 in out_sp or 0 in x.shape or wp.shape[0] == 0:
        return None
    return planes(x, wp.shape[0], wp.group, tuple(wp.kernel), tuple(strides), tuple(dilations), tuple(pb),
                  tuple(out_sp))


def _vector(values, dtype, count: int):
    """``values`` (a bias, or None) as a C-contiguous ``[count]`` vector of ``dtype``."""
    return None if values is None else np.ascontiguousarray(values, dtype=dtype).reshape(count)


def native_act(act):
    """``(kind, lo, hi)`` of a fused activation the compiled kernels apply, from its
    ``native`` form (FusedConv's Relu and Clip); (0, 0, 0) for none."""
    return act if act is not None else (0, 0.0, 0.0)


def depthwise_native(x, wp, strides, dilations, pb, pe, out_sp, y, pad_value, bias, act) -> bool:
    """The depthwise convolution by the compiled kernel, where it takes the layer
    (:func:`native_geometry`), with the bias ``[C]`` and the activation ``act``
    (``(kind, lo, hi)``, or None); False where it did nothing.

    Per plane it does what :func:`depthwise` does in numpy calls (the stride phases
    of the padded input, every tap a contiguous run, the output on the phases' row
    pitch), in one pass in cache; maps of up to 256 positions go channels last, a
    vector of channels at a time. MobileNetV2's depthwise layers on one thread: 8.7 ms
    in numpy calls, 1.4 ms compiled, onnxruntime 1.1 ms."""
    geo = native_geometry(x, wp, strides, dilations, pb, pe, out_sp, pad_value)
    if geo is None:
        return False
    x4, g = geo
    native.K.depthwise2d(x4, wp.depthwise, _vector(bias, x.dtype, g.c), y, g.window(), *native_act(act),
                         parallel.thread_count())
    return True


def conv_native(x, wp, strides, dilations, pb, pe, out_sp, y, pad_value, bias, residual, act) -> bool:
    """The convolution by the compiled kernel (im2col in cache-sized chunks, numpy's
    BLAS, bias, residual and activation on each tile while it is in cache, the
    chunks on the compiled pool), where it takes the layer (:func:`native_geometry`,
    and numpy's BLAS handed over); False where it did nothing."""
    if not native.BLAS:
        return False
    geo = native_geometry(x, wp, strides, dilations, pb, pe, out_sp, pad_value)
    if geo is None:
        return False
    x4, g = geo
    bias = _vector(bias, x.dtype, g.m)
    if residual is not None:
        residual = np.ascontiguousarray(residual, dtype=x.dtype)
    kind, lo, hi = native_act(act)
    kernel, out_sp = (g.kh, g.kw), (g.oh, g.ow)
    if winograd_pays(x4, wp, kernel, (g.sh, g.sw), (g.dh, g.dw), out_sp):
        native.K.winograd3x3(x4, wp.winograd(), bias, residual, y, g, kind, lo, hi, parallel.thread_count())
        return True
    if direct_pays(x4, wp, kernel, out_sp, wide=True):
        try:
            native.K.direct2d(x4, wp.gemm, bias, residual, y, g, kind, lo, hi, parallel.thread_count())
            return True
        except MemoryError:
            pass  # input phases past the compiled kernel's limit: im2col below, in bounded tiles
    try:
        native.K.conv2d(x4, wp.gemm, bias, residual, y, g, kind, lo, hi, parallel.thread_count())
    except MemoryError:
        # a kernel so large that a tile of its gathered columns passes the compiled
        # kernel's limit: the numpy path gathers in bounded bands
        return False
    return True


class NativeCall:
    """One float convolution's compiled call with everything but the input, the
    residual and the output derived once (:func:`native_call`): the kernel, the
    packed weight, the bias vector, the geometry and the activation's form. The
    choice among the compiled kernels (``fn``, the name of the compiled function),
    the geometry, the bias's conversion and the checks of :func:`conv_native` cost
    10-15 us of Python a call, on every run of every layer, where the compiled
    kernel of a small layer takes 20-100 us.

    It holds the node's constant weight and bias (``w``, ``b``: the kernel checks by
    identity that a call is given those) and returns a new output every call."""

    __slots__ = ("fn", "weight", "bias", "geometry", "act", "x_shape", "out_shape", "dtype", "depthwise", "w", "b",
                 "activation")

    def __init__(self, fn, weight, bias, geometry, act, x_shape, out_shape, dtype, depthwise: bool, w, b,
                 activation):
        self.fn, self.weight, self.bias, self.geometry, self.act = fn, weight, bias, geometry, act
        self.x_shape, self.out_shape, self.dtype, self.depthwise = x_shape, out_shape, dtype, depthwise
        self.w, self.b, self.activation = w, b, activation

    def __call__(self, x, residual=None):
        """The convolution of ``x`` (of the shape and dtype this call was made for)
        plus ``residual`` (not for the depthwise kernel's), activated, into a new
        array; None where the compiled kernel refused it for its size (MemoryError),
        or the compiled module or its BLAS products are no longer there: the caller
        takes the other paths."""
        kernels = native.K
        if kernels is None or not (self.depthwise or native.BLAS):
            return None
        fn = getattr(kernels, self.fn)  # by name: the module may be replaced (tests count its calls)
        x4 = np.ascontiguousarray(x)
        if x4.shape != self.x_shape:
            x4 = x4.reshape(self.x_shape)  # a 1-D convolution as one row
        y = np.empty(self.out_shape, self.dtype)
        kind, lo, hi = self.act
        if self.depthwise:
            fn(x4, self.weight, self.bias, y, self.geometry, kind, lo, hi, parallel.thread_count())
            return y
        if residual is not None:
            if residual.shape != self.out_shape:
                raise ValueError(f"Z has shape {residual.shape}, the convolution gives {self.out_shape}")
            residual = np.ascontiguousarray(residual, dtype=self.dtype)
        try:
            fn(x4, self.weight, self.bias, residual, y, self.geometry, kind, lo, hi, parallel.thread_count())
        except MemoryError:
            return None
        return y


def native_call(x, wp, strides, dilations, pb, pe, out_sp, bias, residual, activation, w, b) -> NativeCall | None:
    """The :class:`NativeCall` that does what :func:`~onnxrt_cpu.conv.forward.convolve`
    does for this layer and this input shape, where that is one compiled call with
    the activation fused (the depthwise kernel without a residual, Winograd's, the
    direct kernel, im2col in tiles); None where convolve takes another path (the
    narrow kernel's layers included, which its own module chooses), or the
    activation runs in numpy. ``x`` and ``bias`` are in the compute dtype; ``w`` and
    ``b`` are the node's constants the call is kept for."""
    fused = getattr(activation, "native", None)
    if activation is not None and fused is None:
        return None
    m = wp.shape[0]
    if x.shape[1] != wp.shape[1] * wp.group or (bias is not None and bias.shape != (m,)):
        return None  # convolve names what is wrong
    kernel = tuple(wp.kernel)
    unit = all(k == 1 for k in kernel) and all(s == 1 for s in strides) and not any(pb) and not any(pe)
    out_shape = (x.shape[0], m, *out_sp)
    act = native_act(fused)
    geo = native_geometry(x, wp, strides, dilations, pb, pe, out_sp, 0)
    if geo is None:
        return None
    x4, g = geo
    bvec = _vector(bias, x.dtype, g.m)
    if wp.depthwise is not None and not unit:
        if residual is not None:
            return None
        return NativeCall("depthwise2d", wp.depthwise, bvec, g.window(), act, x4.shape, out_shape, x.dtype,
                          True, w, b, activation)
    from .narrow import narrow_pays  # the narrow kernel's own choice, made before the compiled kernels'

    if narrow_pays(x, wp, wp.kernel, strides, pb, pe, out_sp) or not native.BLAS:
        return None
    kernel2, out2 = (g.kh, g.kw), (g.oh, g.ow)
    if winograd_pays(x4, wp, kernel2, (g.sh, g.sw), (g.dh, g.dw), out2):
        fn, weight = "winograd3x3", wp.winograd()
    elif direct_pays(x4, wp, kernel2, out2, wide=True):
        fn, weight = "direct2d", wp.gemm
    else:
        fn, weight = "conv2d", wp.gemm
    return NativeCall(fn, weight, bvec, g, act, x4.shape, out_shape, x.dtype, False, w, b, activation)


def qlinear_conv_native(x, wp32, w8, bias, mult, y, kernel, strides, dilations, pb, out_sp, zp: int,
                        y_zp: int) -> bool:
    """QLinearConv of the 8-bit ``x`` (2-D, or 1-D as one row) into the 8-bit ``y`` by
    the compiled kernels: the 8-bit products where ``w8`` (the weight packed by
    :func:`~onnxrt_cpu.native.pack_conv_int8`) is given, else the direct kernel or
    im2col on ``wp32``'s centred float32 weight, each tile requantized with ``mult``
    (float32 [M] or [1]) and ``bias`` (float32 [M] or None) while in cache. False
    where the kernel refused the layer for its size (the numpy path gathers in
    bounded bands)."""
    x4, g = planes(x, y.shape[1], wp32.group, tuple(kernel), tuple(strides), tuple(dilations), tuple(pb),
                   tuple(out_sp))
    try:
        if w8 is not None:
            # 8-bit products (AVX-512 VNNI): the same output bit for bit, the
            # products four times as dense as float32's
            native.K.qconv8(x4, w8[0], w8[1], bias, mult, y, g, zp, y_zp, parallel.thread_count())
        elif direct_pays(np.empty(0, np.float32), wp32, (g.kh, g.kw), (g.oh, g.ow)):
            # few output channels or a short reduction: the direct kernel (the
            # QDQ ResNet-style model's 7x7 stem of 16 channels, batch 8: 935 ->
            # 400 us on two threads)
            native.K.qdirect2d(x4, wp32.gemm, bias, mult, y, g, zp, y_zp, parallel.thread_count())
        else:
            native.K.qconv2d(x4, wp32.gemm, bias, mult, y, g, zp, y_zp, parallel.thread_count())
    except MemoryError:
        return False
    return True
