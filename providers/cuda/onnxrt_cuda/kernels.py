"""The CUDA provider's own kernels, written against the array namespace ``xp``.

The provider binds them to CuPy (``xp = cupy``); the tests bind them to numpy and
compare them with the CPU provider, so their arithmetic is checked without a GPU.
They cover what the CPU provider's kernels do on the host with numpy-only calls, or
what is worth doing differently on a GPU:

- MatMul and Gemm: one ``xp.matmul`` (cuBLAS), constant weights uploaded and
  transposed once; float16 stays float16.
- Conv: im2col (a strided window view, materialized once) and one batched GEMM over
  all groups; depthwise convolutions skip im2col and sum the kernel taps directly.
- MaxPool, AveragePool and the global pools over the same window view.
- Softmax, LogSoftmax, LayerNormalization, BatchNormalization (inference), Cast and
  Gather, with float16 accumulated in float32.

:data:`KERNELS` lists them as ``(op_type, since, class, accepts)``.
"""

from __future__ import annotations

import numpy as np
from onnx import helper
from onnxrt.plugin.kernel import Kernel

from . import raw
from .codegen import CTYPES

__all__ = ["DEPTHWISE_SOURCE", "KERNELS"]

F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)


def _wide(x):
    """float16 values are accumulated in float32."""
    return x.astype(F32) if x.dtype == F16 else x


def _as_strided(xp, x, shape, strides):
    return xp.lib.stride_tricks.as_strided(x, shape=shape, strides=strides)


class DeviceKernel(Kernel):
    """A kernel whose constant inputs are uploaded once, in ``setup``."""

    def const(self, i: int, transform=None):
        """Constant input ``i`` on the device (after ``transform`` on the host), or None."""
        c = self.node.constants.get(i)
        if c is None:
            return None
        c = np.asarray(c)
        if transform is not None:
            c = transform(c)
        return self.xp.asarray(np.ascontiguousarray(c))


# -- matrix products ----------------------------------------------------------------------


class MatMul(DeviceKernel):
    """numpy ``matmul`` semantics; the product runs in cuBLAS."""

    def setup(self):
        self.b = self.const(1)

    def run(self, a, b):
        if a.dtype != b.dtype:
            raise ValueError(f"{self.node.describe()}: operands have different dtypes {a.dtype} and {b.dtype}")
        if a.ndim == 0 or b.ndim == 0:
            raise ValueError(f"{self.node.describe()}: operands must have rank >= 1, got {a.shape} and {b.shape}")
        bb = self.b if self.b is not None and self.b.shape == b.shape else b
        try:
            if a.ndim > 2 and bb.ndim == 2 and a.shape[-1] == bb.shape[0]:
                # one product over the folded batch: matmul would broadcast B to every
                # leading index (a batched product, or a copy of B per index)
                y = self.xp.matmul(a.reshape(-1, a.shape[-1]), bb).reshape(a.shape[:-1] + bb.shape[1:])
                return (y,)
            y = self.xp.matmul(a, bb)
        except ValueError as e:
            raise ValueError(f"{self.node.describe()}: cannot multiply shapes {a.shape} and {b.shape}: {e}") from None
        return (self.xp.asarray(y),)


class Gemm(DeviceKernel):
    """``alpha * A' @ B' + beta * C``; a constant B is transposed and scaled once."""

    def setup(self):
        at = self.attrs
        self.alpha = float(at.get("alpha", 1.0))
        self.beta = float(at.get("beta", 1.0))
        self.trans_a = bool(at.get("transA", 0))
        self.trans_b = bool(at.get("transB", 0))
        b = self.node.constants.get(1)
        self.b = None
        if b is not None and b.ndim == 2 and b.dtype.kind == "f":
            bp = b.T if self.trans_b else b
            self.b = self.xp.asarray(np.ascontiguousarray(bp * b.dtype.type(self.alpha) if self.alpha != 1 else bp))
        c = self.node.constants.get(2)
        self.c = None
        if c is not None and c.dtype.kind == "f" and self.beta != 0:
            self.c = self.xp.asarray(np.ascontiguousarray(c * c.dtype.type(self.beta) if self.beta != 1 else c))

    def run(self, a, b, c=None):
        xp = self.xp
        if a.ndim != 2 or b.ndim != 2:
            raise ValueError(f"{self.node.describe()}: A and B must be 2-D, got shapes {a.shape} and {b.shape}")
        aa = a.T if self.trans_a else a
        if self.b is not None:
            bb, scaled = self.b, True
        else:
            bb, scaled = (b.T if self.trans_b else b), False
        if aa.shape[1] != bb.shape[0]:
            raise ValueError(f"{self.node.describe()}: inner dimensions differ: A' is {aa.shape}, B' is {bb.shape}")
        y = xp.matmul(aa, bb)
        if not scaled and self.alpha != 1.0:
            y = (y * self.alpha).astype(a.dtype, copy=False)
        if c is not None and self.beta != 0.0:
            cc = self.c if self.c is not None and self.c.shape == c.shape else None
            if cc is None:
                cc = c if self.beta == 1.0 else (c * self.beta).astype(c.dtype, copy=False)
            try:
                y = y + cc
            except ValueError:
                raise ValueError(f"{self.node.describe()}: C of shape {c.shape} does not broadcast to {y.shape}") from None
        return (y.astype(a.dtype, copy=False),)


# -- convolution ----------------------------------------------------------------------------


def _pads(node, x_spatial, kernel, strides, dilations):
    """(begin, end) pads per spatial axis, from ``pads`` or ``auto_pad``."""
    at = node.attrs
    nd = len(kernel)
    auto = at.get("auto_pad", "NOTSET")
    if isinstance(auto, bytes):
        auto = auto.decode()
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for i in range(nd):
            out = -(-x_spatial[i] // strides[i])
            total = max(0, (out - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - x_spatial[i])
            small, big = total // 2, total - total // 2
            begin.append(small if auto == "SAME_UPPER" else big)
            end.append(big if auto == "SAME_UPPER" else small)
        return begin, end
    if auto == "VALID":
        return [0] * nd, [0] * nd
    p = list(at.get("pads", [0] * (2 * nd)))
    return p[:nd], p[nd:]


def _windows(xp, x, kernel, strides, dilations, begin, end, fill):
    """A view ``(N, C, *out, *kernel)`` of the padded input's sliding windows."""
    nd = len(kernel)
    if any(begin) or any(end):
        pad = [(0, 0), (0, 0)] + list(zip(begin, end))
        x = xp.pad(x, pad, mode="constant", constant_values=fill)
    x = xp.ascontiguousarray(x)
    sp = x.shape[2:]
    out = [(sp[i] - (kernel[i] - 1) * dilations[i] - 1) // strides[i] + 1 for i in range(nd)]
    if any(o <= 0 for o in out):
        raise ValueError(f"the window {kernel} does not fit the padded input {tuple(sp)}")
    st = x.strides
    shape = x.shape[:2] + tuple(out) + tuple(kernel)
    strides_v = st[:2] + tuple(st[2 + i] * strides[i] for i in range(nd)) + tuple(st[2 + i] * dilations[i] for i in range(nd))
    return _as_strided(xp, x, shape, strides_v), out


class Conv(DeviceKernel):
    """1-D and 2-D convolution: im2col and one batched GEMM; depthwise sums taps directly."""

    def setup(self):
        at = self.attrs
        self.group = int(at.get("group", 1))
        w = self.node.constants.get(1)
        self.w = None if w is None else self.xp.asarray(np.ascontiguousarray(w))
        b = self.node.constants.get(2)
        self.bias = None if b is None else self.xp.asarray(np.ascontiguousarray(b))
        #: what raw.conv2d_im2col derives from the constant weight and bias, built once
        self.kept: dict = {}

    def run(self, x, w, b=None):
        xp = self.xp
        desc = self.node.describe()
        w = self.w if self.w is not None and self.w.shape == w.shape else w
        if b is not None:
            b = self.bias if self.bias is not None and self.bias.shape == b.shape else b
        nd = x.ndim - 2
        if nd not in (1, 2) or w.ndim != x.ndim:
            raise ValueError(f"{desc}: expected 1-D or 2-D convolution with matching weight rank, got X {x.shape} and W {w.shape}")
        if nd == 1:
            (y,) = self._run2d(xp, x[:, :, None, :], w[:, :, None, :], b, desc, one_d=True)
            return (y[:, :, 0, :],)
        return self._run2d(xp, x, w, b, desc)

    def _run2d(self, xp, x, w, b, desc, one_d=False):
        at = self.attrs
        n, c = x.shape[:2]
        m, cg = w.shape[:2]
        kernel = list(w.shape[2:])
        g = self.group
        if c != cg * g or m % g:
            raise ValueError(f"{desc}: X has {c} channels but W {tuple(w.shape)} with group {g} expects {cg * g}")
        def attr(name, default):
            v = list(at.get(name, default))
            return [1] + v if one_d else v
        strides = attr("strides", [1] * (1 if one_d else 2))
        dil = attr("dilations", [1] * (1 if one_d else 2))
        begin, end = _pads(self.node, x.shape[2:] if not one_d else x.shape[3:], kernel[1:] if one_d else kernel,
                           strides[1:] if one_d else strides, dil[1:] if one_d else dil)
        if one_d:
            begin, end = [0] + begin, [0] + end
        kh, kw = kernel
        if g == c == m and cg == 1 and hasattr(xp, "RawKernel") and x.dtype in (F32, np.dtype(np.float64)):
            return (_depthwise_raw(xp, x, w, b, kernel, strides, dil, begin, end),)
        if hasattr(xp, "RawModule") and x.dtype in raw.TYPES and w.dtype == x.dtype and not (g == c == m and cg == 1):
            kept = self.kept if w is self.w and b is self.bias else None
            return (raw.conv2d_im2col(xp, x, w, b, g, strides, dil, begin, end, kept),)
        win, (oh, ow) = _windows(xp, x, kernel, strides, dil, begin, end, 0)
        if g == c == m and cg == 1:
            # depthwise: kh*kw multiply-adds over the window view, no im2col matrix
            wd = _wide(w)
            y = xp.zeros((n, c, oh, ow), dtype=wd.dtype)
            for i in range(kh):
                for j in range(kw):
                    y += _wide(win[..., i, j]) * wd[None, :, 0, i, j, None, None]
            y = y.astype(x.dtype, copy=False)
        else:
            # im2col: (N, G, Cg*kh*kw, OH*OW), one matmul with W as (G, M/G, Cg*kh*kw)
            # (N, C, kh, kw, OH, OW): the one reshape below materializes the column matrix
            cols = win.transpose(0, 1, 4, 5, 2, 3).reshape(n, g, cg * kh * kw, oh * ow)
            wm = w.reshape(g, m // g, cg * kh * kw)
            y = xp.matmul(wm[None], cols).reshape(n, m, oh, ow)
        if b is not None:
            y = y + b.reshape(1, m, 1, 1).astype(y.dtype, copy=False)
        return (y,)


#: the depthwise 2-D convolution as one CUDA kernel: one thread per output element,
#: compiled by NVRTC through ``cupy.RawKernel`` with ``DW_T`` (the element type) and ``DW_ACC``
#: (the accumulator type) defined: float or double
DEPTHWISE_SOURCE = r"""
extern "C" __global__ void onnxrt_depthwise_conv2d(
    const DW_T* __restrict__ x, const DW_T* __restrict__ w, const DW_T* __restrict__ bias, DW_T* __restrict__ y,
    const int N, const int C, const int H, const int W, const int OH, const int OW,
    const int KH, const int KW, const int SH, const int SW, const int PH, const int PW,
    const int DH, const int DW, const int has_bias)
{
    const long long total = (long long)N * C * OH * OW;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (long long)blockDim.x * gridDim.x) {
        const int ow = (int)(idx % OW);
        const int oh = (int)((idx / OW) % OH);
        const int c = (int)((idx / ((long long)OW * OH)) % C);
        const long long n = idx / ((long long)OW * OH * C);
        const DW_T* xc = x + (n * C + c) * (long long)H * W;
        const DW_T* wc = w + (long long)c * KH * KW;
        DW_ACC acc = has_bias ? (DW_ACC)bias[c] : (DW_ACC)0;
        for (int i = 0; i < KH; ++i) {
            const int ih = oh * SH - PH + i * DH;
            if (ih < 0 || ih >= H) continue;
            for (int j = 0; j < KW; ++j) {
                const int iw = ow * SW - PW + j * DW;
                if (iw < 0 || iw >= W) continue;
                acc += (DW_ACC)xc[(long long)ih * W + iw] * (DW_ACC)wc[i * KW + j];
            }
        }
        y[idx] = (DW_T)acc;
    }
}
"""


_raw_kernels: dict = {}


def _depthwise_raw(cp, x, w, b, kernel, strides, dil, begin, end):  # pragma: no cover - needs a GPU
    """Depthwise 2-D convolution with :data:`DEPTHWISE_SOURCE` (float32 or float64)."""
    n, c, h, wd = x.shape
    kh, kw = kernel
    oh = (h + begin[0] + end[0] - (kh - 1) * dil[0] - 1) // strides[0] + 1
    ow = (wd + begin[1] + end[1] - (kw - 1) * dil[1] - 1) // strides[1] + 1
    if oh <= 0 or ow <= 0:
        raise ValueError(f"the window {kernel} does not fit the padded input {(h, wd)}")
    key = (x.dtype.str, cp.cuda.Device().id)
    k = _raw_kernels.get(key)
    if k is None:
        t = "float" if x.dtype == F32 else "double"
        k = cp.RawKernel(DEPTHWISE_SOURCE, "onnxrt_depthwise_conv2d", options=(f"-DDW_T={t}", f"-DDW_ACC={t}"))
        _raw_kernels[key] = k
    x = cp.ascontiguousarray(x)
    w = cp.ascontiguousarray(w.astype(x.dtype, copy=False))
    bias = cp.ascontiguousarray(b.astype(x.dtype, copy=False)) if b is not None else w
    y = cp.empty((n, c, oh, ow), dtype=x.dtype)
    total = y.size
    threads = 256
    blocks = max(1, min((total + threads - 1) // threads, 65535))
    i32 = np.int32
    k((blocks,), (threads,), (x, w, bias, y, i32(n), i32(c), i32(h), i32(wd), i32(oh), i32(ow), i32(kh), i32(kw),
                              i32(strides[0]), i32(strides[1]), i32(begin[0]), i32(begin[1]), i32(dil[0]), i32(dil[1]),
                              i32(b is not None)))
    return y


# -- pooling --------------------------------------------------------------------------------


def _pool_accepts(node) -> str | None:
    at = node.attrs
    if len(node.outputs) > 1 and node.outputs[1]:
        return "MaxPool with an Indices output runs on the CPU"
    if any(d != 1 for d in at.get("dilations", [])):
        return "dilated pooling runs on the CPU"
    if len(at.get("kernel_shape", [])) != 2:
        return "only 2-D pooling runs on CUDA"
    if at.get("ceil_mode", 0) and node.op_type == "AveragePool":
        return "AveragePool with ceil_mode runs on the CPU"
    return None


class Pool(DeviceKernel):
    """2-D MaxPool and AveragePool over the window view."""

    def run(self, x):
        xp = self.xp
        at = self.attrs
        kernel = list(at["kernel_shape"])
        strides = list(at.get("strides", [1, 1]))
        dil = [1, 1]
        begin, end = _pads(self.node, x.shape[2:], kernel, strides, dil)
        is_max = self.node.op_type == "MaxPool"
        if is_max and at.get("ceil_mode", 0):
            for i in range(2):
                span = x.shape[2 + i] + begin[i] + end[i] - kernel[i]
                out = -(-span // strides[i]) + 1
                # the last window must start inside the input or the left padding
                if (out - 1) * strides[i] >= x.shape[2 + i] + begin[i]:
                    out -= 1
                end[i] += max(0, (out - 1) * strides[i] + kernel[i] - (x.shape[2 + i] + begin[i] + end[i]))
        sizes = [(x.shape[2 + i] + begin[i] + end[i] - kernel[i]) // strides[i] + 1 for i in range(2)]
        if 0 in sizes:
            # a window that just fits nowhere: an empty axis, as on the CPU and in
            # onnxruntime (a window past the padded input still fails in _windows)
            return (xp.empty(x.shape[:2] + tuple(sizes), dtype=x.dtype),)
        xw = _wide(x)
        fill = -np.inf if is_max else 0
        if is_max and x.dtype.kind != "f":
            fill = np.iinfo(x.dtype).min
        win, _ = _windows(xp, xw, kernel, strides, dil, begin, end, fill)
        if is_max:
            y = win.max(axis=(-2, -1))
        else:
            s = win.sum(axis=(-2, -1))
            if at.get("count_include_pad", 0) or not (any(begin) or any(end)):
                y = s / (kernel[0] * kernel[1])
            else:
                ones = xp.ones((1, 1) + x.shape[2:], dtype=s.dtype)
                cnt, _ = _windows(xp, ones, kernel, strides, dil, begin, end, 0)
                y = s / cnt.sum(axis=(-2, -1))
        return (y.astype(x.dtype, copy=False),)


class GlobalPool(DeviceKernel):
    """GlobalAveragePool and GlobalMaxPool: one reduction over the spatial axes."""

    def run(self, x):
        axes = tuple(range(2, x.ndim))
        xw = _wide(x)
        y = xw.max(axis=axes, keepdims=True) if self.node.op_type == "GlobalMaxPool" else xw.mean(axis=axes, keepdims=True)
        return (y.astype(x.dtype, copy=False),)


# -- normalization ---------------------------------------------------------------------------


class Softmax(DeviceKernel):
    """Softmax and LogSoftmax; before opset 13 the input is seen as 2-D at ``axis``."""

    def run(self, x):
        xp = self.xp
        legacy = self.node.opset < 13
        axis = int(self.attrs.get("axis", 1 if legacy else -1))
        if axis < 0:
            axis += x.ndim
        if not 0 <= axis < max(x.ndim, 1):
            raise ValueError(f"{self.node.describe()}: axis {self.attrs.get('axis')} is out of range for rank {x.ndim}")
        shape = x.shape
        if hasattr(xp, "RawModule") and x.dtype in raw.TYPES and (legacy or axis == x.ndim - 1):
            d = int(np.prod(shape[axis:], dtype=np.int64))
            return (raw.softmax_rows(xp, x, d, self.node.op_type == "LogSoftmax"),)
        xw = _wide(x)
        if legacy:
            lead = int(np.prod(shape[:axis], dtype=np.int64))
            xw = xw.reshape(lead, -1)
            ax = 1
        else:
            ax = axis
        z = xw - xw.max(axis=ax, keepdims=True)
        if self.node.op_type == "LogSoftmax":
            y = z - xp.log(xp.exp(z).sum(axis=ax, keepdims=True))
        else:
            e = xp.exp(z)
            y = e / e.sum(axis=ax, keepdims=True)
        return (y.reshape(shape).astype(x.dtype, copy=False),)


class LayerNormalization(DeviceKernel):
    """LayerNormalization over the axes from ``axis`` on, with the optional stash outputs."""

    def setup(self):
        self.scale = self.const(1)
        self.bias = self.const(2)

    def run(self, x, scale, bias=None):
        xp = self.xp
        axis = int(self.attrs.get("axis", -1))
        if axis < 0:
            axis += x.ndim
        eps = float(self.attrs.get("epsilon", 1e-5))
        axes = tuple(range(axis, x.ndim))
        sc = self.scale if self.scale is not None and self.scale.shape == scale.shape else scale
        bb = None
        if bias is not None:
            bb = self.bias if self.bias is not None and self.bias.shape == bias.shape else bias
        width = int(np.prod(x.shape[axis:], dtype=np.int64))
        stash_dt = helper.tensor_dtype_to_np_dtype(int(self.attrs.get("stash_type", 1)))
        if (hasattr(xp, "RawModule") and x.dtype in raw.TYPES and sc.size == width
                and (bb is None or bb.size == width)
                and np.broadcast_shapes(sc.shape, x.shape[axis:]) == x.shape[axis:]
                and (bb is None or np.broadcast_shapes(bb.shape, x.shape[axis:]) == x.shape[axis:])):
            y, mean, inv = raw.layer_norm_rows(xp, x, sc, bb, eps, width)
            stat = x.shape[:axis] + (1,) * len(axes)
            return (y, mean.reshape(stat).astype(stash_dt, copy=False), inv.reshape(stat).astype(stash_dt, copy=False))
        xw = _wide(x)
        mean = xw.mean(axis=axes, keepdims=True)
        d = xw - mean
        var = (d * d).mean(axis=axes, keepdims=True)
        inv = 1 / xp.sqrt(var + eps)
        y = d * inv * _wide(sc)
        if bb is not None:
            y = y + _wide(bb)
        return (y.astype(x.dtype, copy=False), mean.astype(stash_dt, copy=False), inv.astype(stash_dt, copy=False))


def _bn_accepts(node) -> str | None:
    if node.attrs.get("training_mode", 0) or sum(1 for o in node.outputs if o) > 1:
        return "BatchNormalization in training mode runs on the CPU"
    if node.opset < 6 and node.attrs.get("spatial", 1) == 0:
        return "non-spatial BatchNormalization runs on the CPU"
    return None


class BatchNormalization(DeviceKernel):
    """Inference BatchNormalization; constant statistics fold into one scale and shift."""

    def setup(self):
        self.eps = float(self.attrs.get("epsilon", 1e-5))
        c = self.node.constants
        self.folded = None
        if all(i in c for i in (1, 2, 3, 4)):
            scale, b, mean, var = (np.asarray(c[i], dtype=np.float64) for i in (1, 2, 3, 4))
            k = scale / np.sqrt(var + self.eps)
            self.folded = (self.xp.asarray(k.astype(np.float32)), self.xp.asarray((b - mean * k).astype(np.float32)))

    def run(self, x, scale, b, mean, var):
        xp = self.xp
        shape = (1, -1) + (1,) * (x.ndim - 2)
        if self.folded is not None and self.folded[0].shape[0] == x.shape[1]:
            k, sh = self.folded
        else:
            k = _wide(scale) / xp.sqrt(_wide(var) + self.eps)
            sh = _wide(b) - _wide(mean) * k
        xw = _wide(x)
        y = xw * k.reshape(shape).astype(xw.dtype, copy=False) + sh.reshape(shape).astype(xw.dtype, copy=False)
        return (y.astype(x.dtype, copy=False),)


# -- data movement --------------------------------------------------------------------------


def _cast_accepts(node) -> str | None:
    try:
        to = np.dtype(helper.tensor_dtype_to_np_dtype(int(node.attrs["to"])))
    except Exception:  # noqa: BLE001
        return "Cast to this type runs on the CPU"
    return None if to in CTYPES else f"Cast to {to} runs on the CPU"


class Cast(DeviceKernel):
    """Cast between the numeric and bool types the device holds."""

    def setup(self):
        self.to = np.dtype(helper.tensor_dtype_to_np_dtype(int(self.attrs["to"])))

    def run(self, x):
        if x.dtype == self.to:
            return (x.copy(),)
        return (x.astype(self.to),)


class Gather(DeviceKernel):
    """``take`` along ``axis`` with negative indices; out-of-range indices are an error."""

    def setup(self):
        self.axis = int(self.attrs.get("axis", 0))
        idx = self.node.constants.get(1)
        self.idx = None if idx is None else np.asarray(idx)

    def run(self, x, indices):
        xp = self.xp
        axis = self.axis + x.ndim if self.axis < 0 else self.axis
        if not 0 <= axis < x.ndim:
            raise ValueError(f"{self.node.describe()}: axis {self.axis} is out of range for rank {x.ndim}")
        d = x.shape[axis]
        if self.idx is not None and self.idx.shape == indices.shape:
            host = self.idx
            if host.size and (host.min() < -d or host.max() >= d):
                raise IndexError(f"{self.node.describe()}: indices must be in [{-d}, {d - 1}]")
        elif indices.size and bool(((indices < -d) | (indices >= d)).any()):
            raise IndexError(f"{self.node.describe()}: indices must be in [{-d}, {d - 1}]")
        idx = xp.where(indices < 0, indices + d, indices)
        return (xp.take(x, idx, axis=axis),)


#: (op_type, since, kernel class, accepts)
KERNELS = [
    ("MatMul", 1, MatMul, None),
    ("Gemm", 1, Gemm, None),
    ("Conv", 1, Conv, lambda n: None if len(n.attrs.get("kernel_shape", [0, 0])) in (1, 2) else "only 1-D and 2-D Conv runs on CUDA"),
    ("MaxPool", 1, Pool, _pool_accepts),
    ("AveragePool", 1, Pool, _pool_accepts),
    ("GlobalAveragePool", 1, GlobalPool, None),
    ("GlobalMaxPool", 1, GlobalPool, None),
    ("Softmax", 1, Softmax, None),
    ("LogSoftmax", 1, Softmax, None),
    ("LayerNormalization", 17, LayerNormalization, None),
    ("BatchNormalization", 1, BatchNormalization, _bn_accepts),
    ("Cast", 1, Cast, _cast_accepts),
    ("Gather", 1, Gather, None),
]
