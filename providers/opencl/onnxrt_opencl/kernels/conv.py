"""Convolutions on the device: Conv, com.microsoft FusedConv and ConvTranspose, 1-D to 3-D.

Every spatial rank is run as 3-D, leading axes of size 1 added, so one program
serves them all. Conv takes one of three routes:

* a 1x1, stride-1, unpadded Conv is one GEMM per (image, group) straight on the
  input viewed as ``[C, H*W]``;
* a Conv whose groups have one input channel each (depthwise, with any channel
  multiplier) runs a direct kernel, one work-item per output element;
* anything else copies the strided taps of the input into a column buffer
  ``[N, C * prod(kernel), prod(out)]`` (im2col, implicit zero padding) and runs
  one batched GEMM over (image, group); images are processed in chunks so the
  column buffer stays bounded.

The bias is added in the GEMM's epilogue (or the direct kernel's store), and so
are FusedConv's residual ``Z`` and activation, which the level-2 optimizer makes
out of Conv + Add + Relu (and the other activations) for this provider. The
weight ``[M, C/g, *k]`` is already the GEMM's ``[g, M/g, C/g * prod(k)]`` operand,
so it needs no repacking. Elements are ``real``: float32, or float64 on devices
that have it.

ConvTranspose runs the GEMM first, ``cols = W[g]^T @ x[g]`` (the transposed weight
read through strides), then a gather-form col2im: each output element sums the
column entries of the taps that land on it, so no atomics are needed, and adds
the bias.
"""

from __future__ import annotations

import numpy as np
from onnxrt.errors import InvalidArgument
from onnxrt.plugin.pool_geometry import conv_transpose_geometry

from ..registry import op
from .base import CLKernel
from .gemm import (
    ACTIVATION_DECL,
    ACTIVATIONS,
    FLOATS,
    PARAMS_DECL,
    Operand,
    activation_ok,
    dev,
    fp_options,
    gemm,
    launch_size,
    params,
)

__all__ = ["Conv", "ConvTranspose", "FusedConv", "conv_pads", "spatial_attrs", "to_3d"]

#: Params 0-17 of every windowed kernel (convolution, pooling): (D, H, W) triples of
#: the input, output, kernel, strides, dilations and leading pads; kernels' own follow.
GEOM_DECL = PARAMS_DECL + r"""
#define GEOM_PARAMS \
    const int ID = PI(0), IH = PI(1), IW = PI(2), OD = PI(3), OH = PI(4), OW = PI(5); \
    const int KD = PI(6), KH = PI(7), KW = PI(8), SD = PI(9), SH = PI(10), SW = PI(11); \
    const int DD = PI(12), DH = PI(13), DW = PI(14), PD = PI(15), PH = PI(16), PW = PI(17);
"""

CONV_SOURCE = GEOM_DECL + ACTIVATION_DECL + r"""
/* cols[n][c * KK + tap][l] for a chunk of images: one work-item per output row
   (od, oh) of one (image, channel, tap), walking the row's OW columns */
__kernel void im2col(__global const real* x, __global real* cols, const Params p)
{
    GEOM_PARAMS
    const int offx = PI(18), C = PI(19);
    const int r = get_global_id(0);
    if (r >= OD * OH) return;
    const int tap = get_global_id(1);
    const int nc = get_global_id(2);
    const int L = OD * OH * OW;
    const int KK = KD * KH * KW;
    const int oh = r % OH, od = r / OH;
    const int kw = tap % KW, kh = (tap / KW) % KH, kd = tap / (KW * KH);
    const int id = od * SD - PD + kd * DD, ih = oh * SH - PH + kh * DH;
    __global real* dst = cols + ((size_t)nc * KK + tap) * L + (size_t)r * OW;
    if (id < 0 || id >= ID || ih < 0 || ih >= IH) {
        for (int ow = 0; ow < OW; ow++) dst[ow] = 0.0f;
        return;
    }
    __global const real* src = x + offx + ((size_t)(nc * ID + id) * IH + ih) * IW;
    const int w0 = kw * DW - PW;
    for (int ow = 0; ow < OW; ow++) {
        const int iw = w0 + ow * SW;
        dst[ow] = (iw >= 0 && iw < IW) ? src[iw] : 0.0f;
    }
}

/* y[n][m][o] for convolutions whose groups have Cg input channels (used for Cg == 1) */
__kernel void conv_direct(__global const real* x, __global const real* w, __global const real* bias,
                          __global real* y, __global const real* z, const Params p)
{
    GEOM_PARAMS
    const int offx = PI(18), offw = PI(19), offb = PI(20), has_bias = PI(21), offy = PI(22);
    const int C = PI(23), M = PI(24), Cg = PI(25), Mg = PI(26);
    const int has_z = PI(27), offz = PI(28), act = PI(29);
    const real p0 = PF(30), p1 = PF(31);
    const int l = get_global_id(0);
    const int L = OD * OH * OW;
    if (l >= L) return;
    const int nm = get_global_id(1);
    const int n = nm / M, m = nm - n * M;
    const int ow = l % OW, oh = (l / OW) % OH, od = l / (OW * OH);
    const int c0 = (m / Mg) * Cg;
    real acc = has_bias ? bias[offb + m] : 0.0f;
    const int d0 = od * SD - PD, h0 = oh * SH - PH, w0 = ow * SW - PW;
    for (int c = 0; c < Cg; c++) {
        __global const real* xc = x + offx + (size_t)(n * C + c0 + c) * ID * IH * IW;
        __global const real* wc = w + offw + (size_t)(m * Cg + c) * KD * KH * KW;
        for (int kd = 0; kd < KD; kd++) {
            const int id = d0 + kd * DD;
            if (id < 0 || id >= ID) continue;
            for (int kh = 0; kh < KH; kh++) {
                const int ih = h0 + kh * DH;
                if (ih < 0 || ih >= IH) continue;
                __global const real* xr = xc + (id * IH + ih) * IW;
                __global const real* wr = wc + (kd * KH + kh) * KW;
                for (int kw = 0; kw < KW; kw++) {
                    const int iw = w0 + kw * DW;
                    if (iw >= 0 && iw < IW) acc = mad(wr[kw], xr[iw], acc);
                }
            }
        }
    }
    if (has_z) acc += z[offz + (size_t)nm * L + l];
    y[offy + (size_t)nm * L + l] = activate(act, acc, p0, p1);
}

/* ConvTranspose: y[n][m][o] = bias[m] + sum over taps landing on o of cols[n][m * KK + tap][i].
   Here (ID, IH, IW) is the transposed conv's input grid and (OD, OH, OW) its output. */
__kernel void col2im(__global const real* cols, __global const real* bias, __global real* y,
                     const Params p)
{
    GEOM_PARAMS
    const int offb = PI(18), has_bias = PI(19), offy = PI(20), M = PI(21);
    const int l = get_global_id(0);
    const int L = OD * OH * OW;
    if (l >= L) return;
    const int nm = get_global_id(1);
    const int m = nm % M;
    const int ow = l % OW, oh = (l / OW) % OH, od = l / (OW * OH);
    const int KK = KD * KH * KW;
    const int IL = ID * IH * IW;
    __global const real* cn = cols + (size_t)nm * KK * IL;
    real acc = has_bias ? bias[offb + m] : 0.0f;
    for (int kd = 0; kd < KD; kd++) {
        const int td = od + PD - kd * DD;
        if (td < 0 || td % SD) continue;
        const int id = td / SD;
        if (id >= ID) continue;
        for (int kh = 0; kh < KH; kh++) {
            const int th = oh + PH - kh * DH;
            if (th < 0 || th % SH) continue;
            const int ih = th / SH;
            if (ih >= IH) continue;
            for (int kw = 0; kw < KW; kw++) {
                const int tw = ow + PW - kw * DW;
                if (tw < 0 || tw % SW) continue;
                const int iw = tw / SW;
                if (iw >= IW) continue;
                acc += cn[(size_t)((kd * KH + kh) * KW + kw) * IL + (id * IH + ih) * IW + iw];
            }
        }
    }
    y[offy + (size_t)nm * L + l] = acc;
}
"""

# Work-items per work-group along an image plane: PoCL pays per work-group, so not too few.
_LOCAL = 64

# Images per im2col chunk are chosen so the column buffer stays under this many bytes.
_COLS_BYTES = 64 << 20


# -- geometry (the ONNX rules, shared with pooling) ------------------------------------


def spatial_attrs(attrs: dict, nd: int, kernel, desc: str):
    """``(kernel, strides, dilations)`` as tuples of ``nd`` positive ints."""
    strides = attrs.get("strides") or [1] * nd
    dilations = attrs.get("dilations") or [1] * nd
    if len(strides) != nd or len(dilations) != nd or len(kernel) != nd:
        raise InvalidArgument(
            f"{desc}: kernel {list(kernel)}, strides {list(strides)} and dilations {list(dilations)} "
            f"must each have {nd} entries (the spatial rank)"
        )
    if min(strides) < 1 or min(dilations) < 1 or min(kernel) < 1:
        raise InvalidArgument(f"{desc}: kernel, strides and dilations must be positive")
    return tuple(int(k) for k in kernel), tuple(int(s) for s in strides), tuple(int(d) for d in dilations)


def conv_pads(in_sp, kernel, strides, dilations, pads, auto_pad, desc: str):
    """``(pads_begin, out_spatial)`` of a convolution window per the ONNX Conv rules.

    ``SAME_*`` gives ``ceil(in / stride)`` outputs, the odd padding element going to
    the end (``SAME_UPPER``) or the beginning (``SAME_LOWER``).
    """
    nd = len(in_sp)
    auto_pad = auto_pad or "NOTSET"
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pb, out = [], []
        for i in range(nd):
            o = -(-in_sp[i] // strides[i])
            total = max(0, (o - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - in_sp[i])
            pb.append(total // 2 if auto_pad == "SAME_UPPER" else total - total // 2)
            out.append(o)
        return pb, out
    if auto_pad == "VALID":
        pb = pe = [0] * nd
    elif auto_pad == "NOTSET":
        pads = list(pads) if pads else [0] * (2 * nd)
        if len(pads) != 2 * nd or min(pads) < 0:
            raise InvalidArgument(f"{desc}: pads {pads} must be {2 * nd} non-negative entries")
        pb, pe = pads[:nd], pads[nd:]
    else:
        raise InvalidArgument(f"{desc}: unknown auto_pad {auto_pad!r}")
    out = []
    for i in range(nd):
        o = (in_sp[i] + pb[i] + pe[i] - (kernel[i] - 1) * dilations[i] - 1) // strides[i] + 1
        if o < 1:
            raise InvalidArgument(
                f"{desc}: window {kernel[i]} (dilation {dilations[i]}) does not fit spatial axis {i} "
                f"of size {in_sp[i]} with pads ({pb[i]}, {pe[i]})"
            )
        out.append(o)
    return list(pb), out


def to_3d(values, fill) -> list:
    """A per-axis list for 1-3 spatial axes, left-filled with ``fill`` to three entries."""
    return [fill] * (3 - len(values)) + [int(v) for v in values]


def geometry_args(in_sp, out_sp, kernel, strides, dil, pb) -> list:
    """Params 0-17 of a windowed kernel (each triple padded to 3-D)."""
    return to_3d(in_sp, 1) + to_3d(out_sp, 1) + to_3d(kernel, 1) + to_3d(strides, 1) + to_3d(dil, 1) + to_3d(pb, 0)


def _spatial_rank_ok(node) -> str | None:
    """Refuse convolutions with more than 3 spatial axes (they fall back to the CPU)."""
    ks = node.attrs.get("kernel_shape")
    w = node.constants.get(1)
    rank = None
    if ks is not None:
        rank = len(ks) + 2
    elif w is not None:
        rank = np.ndim(w)
    else:
        tp = node.input_types[0] if node.input_types else None
        if tp is not None and tp.HasField("tensor_type") and tp.tensor_type.HasField("shape"):
            rank = len(tp.tensor_type.shape.dim)
    if rank is not None and not 3 <= rank <= 5:
        return f"the OpenCL {node.op_type} runs 1 to 3 spatial axes, this node has {rank - 2}"
    return None


def _program(rt, dtype):
    """The convolution program for element type ``dtype`` (float32 when unknown)."""
    return rt.program(CONV_SOURCE, fp_options(dtype if dtype is not None else np.float32))


def _check(x, w, desc):
    if x.ndim < 3 or x.ndim > 5:
        raise InvalidArgument(f"{desc}: input must be [N, C, 1 to 3 spatial axes], got shape {x.shape}")
    if w.ndim != x.ndim:
        raise InvalidArgument(f"{desc}: weight shape {w.shape} does not match input shape {x.shape}")


def _check_bias(b, m, desc):
    if b is not None and tuple(b.shape) != (m,):
        raise InvalidArgument(f"{desc}: bias has shape {b.shape}, expected ({m},)")


# -- Conv ------------------------------------------------------------------------------


@op("Conv", since=1, types={"T": FLOATS}, accepts=_spatial_rank_ok)
class Conv(CLKernel):
    """Convolution with groups, strides, dilations and padding (1-3 spatial axes)."""

    def setup(self):
        a = self.attrs
        self.group = int(a.get("group", 1))
        self.auto_pad = a.get("auto_pad", "NOTSET") or "NOTSET"
        self.pads = a.get("pads")

    def prepare(self):
        _program(self.rt, self.node.input_dtype(0))

    def run(self, x, w, b=None):
        return (self._conv(x, w, b),)

    def _conv(self, x, w, b, z=None, activation=(0, 0.0, 0.0)):
        """``activation(conv(x, w) + b + z)``, the bias, residual and activation fused."""
        desc = self.node.describe()
        _check(x, w, desc)
        nd = x.ndim - 2
        n, c = x.shape[:2]
        m, cg = w.shape[:2]
        prg = _program(self.rt, x.dtype)
        dt = x.dtype
        g = self.group
        if g < 1 or m % g or c != cg * g:
            raise InvalidArgument(
                f"{desc}: input has {c} channels; weight {w.shape} with group {g} expects {cg * g}"
                + (f" and output channels divisible by {g}" if g >= 1 and m % g else "")
            )
        ks = self.attrs.get("kernel_shape")
        if ks is not None and tuple(ks) != tuple(w.shape[2:]):
            raise InvalidArgument(f"{desc}: kernel_shape {ks} does not match weight shape {w.shape}")
        kernel, strides, dil = spatial_attrs(self.attrs, nd, w.shape[2:], desc)
        in_sp = x.shape[2:]
        pb, out_sp = conv_pads(in_sp, kernel, strides, dil, self.pads, self.auto_pad, desc)
        _check_bias(b, m, desc)
        rt = self.rt
        y = rt.empty((n, m, *out_sp), x.dtype)
        if z is not None and (tuple(z.shape) != tuple(y.shape) or z.dtype != y.dtype):
            raise InvalidArgument(f"{desc}: Z has shape {z.shape}, the convolution gives {y.shape}")
        if y.size == 0:
            return y
        L = int(np.prod(out_sp))
        mg = m // g
        kk = int(np.prod(kernel))
        geom = geometry_args(in_sp, out_sp, kernel, strides, dil, pb)
        xb, xoff = dev(x)
        yb, yoff = dev(y)
        zb, zoff = dev(z) if z is not None else (yb, 0)
        if cg == 1 and kk > 1:
            wb, woff = dev(w)
            bb, boff = dev(b) if b is not None else (yb, 0)
            rt.launch(prg, "conv_direct", (launch_size(L, _LOCAL), n * m), (_LOCAL, 1), xb, wb, bb, yb, zb,
                      params(*geom, xoff, woff, boff, int(b is not None), yoff, c, m, cg, mg,
                             int(z is not None), zoff, *activation))
            return y
        bias = Operand.of(b, 0, mg, 1, 0) if b is not None else None
        wop = Operand.of(w, 0, mg * cg * kk, cg * kk, 1)
        unit = kk == 1 and all(s == 1 for s in strides) and not any(pb) and list(out_sp) == list(in_sp)
        if unit:
            gemm(rt, mg, L, cg, wop, Operand(xb, xoff, c * L, cg * L, L, 1),
                 Operand(yb, yoff, m * L, mg * L, L), bias, nb_hi=n, nb_lo=g, dtype=dt,
                 z=(zb, zoff) if z is not None else None, activation=activation)
            return y
        per_image = c * kk * L * dt.itemsize
        chunk = max(1, min(n, _COLS_BYTES // max(1, per_image)))
        cols = rt.empty((chunk, c * kk, L), dt)
        colb, _ = dev(cols)
        in_plane = int(np.prod(in_sp))
        for n0 in range(0, n, chunk):
            nc = min(chunk, n - n0)
            rows = int(np.prod(out_sp[:-1]))
            rt.launch(prg, "im2col", (launch_size(rows, 8), kk, nc * c), (8, 1, 1),
                      xb, colb, params(*geom, int(xoff) + n0 * c * in_plane, c))
            gemm(rt, mg, L, cg * kk, wop, Operand(colb, 0, c * kk * L, cg * kk * L, L, 1),
                 Operand(yb, int(yoff) + n0 * m * L, m * L, mg * L, L), bias, nb_hi=nc, nb_lo=g, dtype=dt,
                 z=(zb, int(zoff) + n0 * m * L) if z is not None else None, activation=activation)
        return y


def _fused_conv_ok(node) -> str | None:
    return _spatial_rank_ok(node) or activation_ok(node)


@op("FusedConv", since=1, domain="com.microsoft", types={"T": FLOATS}, accepts=_fused_conv_ok)
class FusedConv(Conv):
    """``activation(Conv(X, W, B) + Z)`` (onnxruntime's fused op), all in the convolution's epilogue."""

    def setup(self):
        super().setup()
        name = self.attrs.get("activation", "")
        ps = [float(v) for v in self.attrs.get("activation_params", [])]
        if name == "Clip":
            ps = (ps + [-np.inf, np.inf][len(ps):])[:2]
        elif name == "LeakyRelu" and not ps:
            ps = [0.01]
        self.activation = (ACTIVATIONS.get(name, 0), *(ps + [0.0, 0.0])[:2])

    def run(self, x, w, b=None, z=None):
        return (self._conv(x, w, b, z, self.activation),)


# -- ConvTranspose -----------------------------------------------------------------------


@op("ConvTranspose", since=1, types={"T": FLOATS}, accepts=_spatial_rank_ok)
class ConvTranspose(CLKernel):
    """Transposed convolution: a GEMM, then a gather-form col2im with the bias."""

    def setup(self):
        a = self.attrs
        self.group = int(a.get("group", 1))
        self.auto_pad = a.get("auto_pad", "NOTSET") or "NOTSET"

    def prepare(self):
        _program(self.rt, self.node.input_dtype(0))

    def run(self, x, w, b=None):
        desc = self.node.describe()
        _check(x, w, desc)
        nd = x.ndim - 2
        n, c = x.shape[:2]
        g = self.group
        if g < 1 or c % g or w.shape[0] != c:
            raise InvalidArgument(f"{desc}: input has {c} channels; weight {w.shape} with group {g} does not fit")
        mg = w.shape[1]
        m = mg * g
        cg = c // g
        kernel, strides, dil = spatial_attrs(self.attrs, nd, w.shape[2:], desc)
        in_sp = x.shape[2:]
        pb, out_sp = conv_transpose_geometry(in_sp, kernel, strides, dil, self.attrs, self.auto_pad, desc)
        _check_bias(b, m, desc)
        rt = self.rt
        y = rt.empty((n, m, *out_sp), x.dtype)
        if y.size == 0:
            return (y,)
        L = int(np.prod(in_sp))
        Lo = int(np.prod(out_sp))
        kk = int(np.prod(kernel))
        chunk = max(1, min(n, _COLS_BYTES // max(1, m * kk * L * x.dtype.itemsize)))
        # an empty input grid leaves no columns: the output is the bias alone
        cols = rt.empty((chunk, m * kk, L), x.dtype) if L else rt.zeros((1,), x.dtype)
        colb, _ = dev(cols)
        xb, xoff = dev(x)
        yb, yoff = dev(y)
        bb, boff = dev(b) if b is not None else (yb, 0)
        geom = geometry_args(in_sp, out_sp, kernel, strides, dil, pb)
        prg = _program(rt, x.dtype)
        for n0 in range(0, n, chunk):
            nc = min(chunk, n - n0)
            if L:
                # cols[n, g] = W[g]^T @ x[n, g], W[g] read as the transpose of [Cg, Mg * KK]
                gemm(rt, mg * kk, L, cg,
                     Operand.of(w, 0, cg * mg * kk, 1, mg * kk),
                     Operand(xb, int(xoff) + n0 * c * L, c * L, cg * L, L, 1),
                     Operand(colb, 0, m * kk * L, mg * kk * L, L), nb_hi=nc, nb_lo=g, dtype=x.dtype)
            rt.launch(prg, "col2im", (launch_size(Lo, _LOCAL), nc * m), (_LOCAL, 1),
                      colb, bb, yb, params(*geom, boff, int(b is not None), int(yoff) + n0 * m * Lo, m))
        return (y,)
