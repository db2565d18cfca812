"""Hand-written CUDA kernels where CuPy's general routines make several passes.

Measured on an H100 at batch 32 (float32): a 3x3 convolution as a padded copy, a
strided window view materialized by CuPy's generic copy and a separate bias pass took
about 1.2 ms for 64 channels at 56x56, where its product alone is 7.4 GFLOP; a
LayerNormalization over 768 values as CuPy reductions and elementwise passes 0.7 ms;
a Softmax over rows of 128 0.8 ms. Here each is one pass over its input (the im2col
columns are then one cuBLAS product):

- :func:`conv2d_im2col`: the column matrix written straight from the unpadded input
  (padding is a bounds check), with a row of ones so that the bias rides in the
  product as one more weight column; large batches go in chunks of images.
- :func:`layer_norm_rows`: one block per row, mean then variance from the row kept in
  cache, in the input's precision (float32 or float64), as the CPU provider does.
- :func:`softmax_rows`: Softmax or LogSoftmax over contiguous rows, one block per row.

float32 and float64 are computed in their own precision, float16 in float32 (rounded
once, on the store); the callers keep their CuPy formulation for other types and layouts.
"""

from __future__ import annotations

import numpy as np

__all__ = ["SOURCE", "conv2d_im2col", "layer_norm_rows", "softmax_rows"]

#: compiled once per element type: ``-DONNXRT_REAL=float`` (or double), also the accumulator
#: type, or ``-DONNXRT_HALF`` for float16 accumulated in float32 (a macro named ``T`` would
#: break NVRTC's own headers)
SOURCE = r"""
#ifdef ONNXRT_HALF
// float16 is stored as its bits and converted with PTX, so no header is needed
typedef unsigned short real;
typedef float acc;
__device__ __forceinline__ acc ld(real h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ real st(acc f) { unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
#else
typedef ONNXRT_REAL real;
typedef ONNXRT_REAL acc;
__device__ __forceinline__ acc ld(real v) { return v; }
__device__ __forceinline__ real st(acc v) { return v; }
#endif
__device__ __forceinline__ acc warp_sum(acc v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ acc take_max(acc m, acc v) {
    // NaN wins, as numpy's max propagates it
    return (v != v || v > m) ? v : m;
}
__device__ __forceinline__ acc warp_max(acc v) {
    for (int o = 16; o > 0; o >>= 1) v = take_max(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// sh holds 33 values; every thread gets the block's sum (MAX false) or maximum (MAX
// true), the lanes past the last warp's partial result reading `identity`
template <bool MAX>
__device__ acc block_reduce(acc v, acc* sh, acc identity) {
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = MAX ? warp_max(v) : warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    if (wid == 0) {
        acc t = lane < nw ? sh[lane] : identity;
        t = MAX ? warp_max(t) : warp_sum(t);
        if (lane == 0) sh[32] = t;
    }
    __syncthreads();
    return sh[32];
}
__device__ __forceinline__ acc block_sum(acc v, acc* sh) { return block_reduce<false>(v, sh, (acc)0); }
__device__ __forceinline__ acc block_max(acc v, acc* sh, acc lowest) { return block_reduce<true>(v, sh, lowest); }

// blockIdx.y walks the column rows (image, channel, tap), blockIdx.x the output
// positions: the row's tap is decoded once per block, each thread decodes only its position
extern "C" __global__ void onnxrt_im2col(
    const real* __restrict__ x, real* __restrict__ cols, const int C, const int H, const int W, const int OH,
    const int OW, const int KH, const int KW, const int SH, const int SW, const int PH, const int PW, const int DH,
    const int DW, const int nb, const int ones_row, const int flat)
{
    const int P = OH * OW;
    const int K = C * KH * KW;
    const int K1 = K + ones_row;
    const long long rows = (long long)nb * K1;
    const real zero = st((acc)0);
    for (long long row = blockIdx.y; row < rows; row += gridDim.y) {
        const int k = (int)(row % K1);
        const long long n = row / K1;
        // flat: one [K1, nb * P] matrix (each row holds every image's positions), else [nb, K1, P]
        real* out = cols + (flat ? ((long long)k * nb + n) * P : row * P);
        if (k >= K) {
            const real one = st((acc)1);
            for (int p = blockIdx.x * blockDim.x + threadIdx.x; p < P; p += blockDim.x * gridDim.x) out[p] = one;
            continue;
        }
        const int j = k % KW;
        const int i = (k / KW) % KH;
        const int c = k / (KW * KH);
        const real* xc = x + (n * C + c) * (long long)H * W;
        const int h0 = i * DH - PH, w0 = j * DW - PW;
        for (int p = blockIdx.x * blockDim.x + threadIdx.x; p < P; p += blockDim.x * gridDim.x) {
            const int oh = p / OW, ow = p - oh * OW;
            const int ih = oh * SH + h0, iw = ow * SW + w0;
            out[p] = (ih >= 0 && ih < H && iw >= 0 && iw < W) ? xc[ih * W + iw] : zero;
        }
    }
}

extern "C" __global__ void onnxrt_layer_norm(
    const real* __restrict__ x, const real* __restrict__ scale, const real* __restrict__ bias, real* __restrict__ y,
    acc* __restrict__ mean_out, acc* __restrict__ inv_out, const long long rows, const int D, const acc eps,
    const int has_bias)
{
    __shared__ acc sh[33];
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const real* xr = x + r * D;
        real* yr = y + r * D;
        acc s = 0;
        for (int i = threadIdx.x; i < D; i += blockDim.x) s += ld(xr[i]);
        const acc mean = block_sum(s, sh) / (acc)D;
        acc q = 0;
        for (int i = threadIdx.x; i < D; i += blockDim.x) {
            const acc d = ld(xr[i]) - mean;
            q += d * d;
        }
        const acc var = block_sum(q, sh) / (acc)D;
        const acc inv = (acc)1 / sqrt(var + eps);
        for (int i = threadIdx.x; i < D; i += blockDim.x) {
            acc v = (ld(xr[i]) - mean) * inv * ld(scale[i]);
            if (has_bias) v += ld(bias[i]);
            yr[i] = st(v);
        }
        if (threadIdx.x == 0) {
            mean_out[r] = mean;
            inv_out[r] = inv;
        }
    }
}

extern "C" __global__ void onnxrt_softmax(
    const real* __restrict__ x, real* __restrict__ y, const long long rows, const int D, const int log_out,
    const acc lowest)
{
    __shared__ acc sh[33];
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const real* xr = x + r * D;
        real* yr = y + r * D;
        acc m = lowest;
        for (int i = threadIdx.x; i < D; i += blockDim.x) m = take_max(m, ld(xr[i]));
        m = block_max(m, sh, lowest);
        acc s = 0;
        for (int i = threadIdx.x; i < D; i += blockDim.x) s += exp(ld(xr[i]) - m);
        s = block_sum(s, sh);
        if (log_out) {
            const acc ls = log(s);
            for (int i = threadIdx.x; i < D; i += blockDim.x) yr[i] = st((ld(xr[i]) - m) - ls);
        } else {
            for (int i = threadIdx.x; i < D; i += blockDim.x) yr[i] = st(exp(ld(xr[i]) - m) / s);
        }
    }
}
"""

#: the element types these kernels are compiled for -> (NVRTC options, accumulator dtype)
TYPES = {np.dtype(np.float32): (("-DONNXRT_REAL=float",), np.dtype(np.float32)),
         np.dtype(np.float64): (("-DONNXRT_REAL=double",), np.dtype(np.float64)),
         np.dtype(np.float16): (("-DONNXRT_HALF",), np.dtype(np.float32))}

#: most bytes one chunk of im2col columns may take; larger batches go in chunks
IM2COL_BYTES = 256 << 20

_modules: dict = {}


def _kernel(cp, dtype, name: str):
    key = (np.dtype(dtype).str, cp.cuda.Device().id)
    mod = _modules.get(key)
    if mod is None:
        mod = cp.RawModule(code=SOURCE, options=TYPES[np.dtype(dtype)][0])
        _modules[key] = mod
    return mod.get_function(name)


def _blocks(total: int, threads: int) -> int:
    return max(1, min((total + threads - 1) // threads, 1 << 20))


def conv2d_im2col(cp, x, w, b, group, strides, dil, begin, end, kept=None):
    """2-D convolution of contiguous ``x`` [N, C, H, W] by ``w`` [M, C/group, kh, kw].

    ``kept``: a dict the caller keeps for the node when ``w`` and ``b`` are its
    constants; the weight with the bias as its last column is built into it once."""
    n, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    oh = (h + begin[0] + end[0] - (kh - 1) * dil[0] - 1) // strides[0] + 1
    ow = (wd + begin[1] + end[1] - (kw - 1) * dil[1] - 1) // strides[1] + 1
    if oh <= 0 or ow <= 0:
        raise ValueError(f"the window {(kh, kw)} does not fit the padded input {(h, wd)}")
    x = cp.ascontiguousarray(x)
    p = oh * ow
    k = cg * kh * kw
    y = cp.empty((n, m, oh, ow), dtype=x.dtype)
    pointwise = kh == kw == 1 and strides == [1, 1] and not any(begin) and not any(end)
    if pointwise and group == 1:
        # a 1x1 convolution is the product itself: no columns
        if x.dtype == np.float16 and n > 1:
            # one 2-D product (see ``flat`` below): channels first, then back
            xc = x.reshape(n, c, p).transpose(1, 0, 2).reshape(c, n * p)
            y.reshape(n, m, p)[...] = cp.matmul(w.reshape(m, c), xc).reshape(m, n, p).transpose(1, 0, 2)
        else:
            cp.matmul(w.reshape(m, c), x.reshape(n, c, p), out=y.reshape(n, m, p))
        if b is not None:
            y += b.reshape(1, m, 1, 1).astype(y.dtype, copy=False)
        return y
    ones = int(b is not None and group == 1)
    if ones:
        wm = None if kept is None else kept.get("biased")
        if wm is None:
            wm = cp.concatenate([w.reshape(m, k), b.reshape(m, 1).astype(w.dtype, copy=False)], axis=1)
            if kept is not None:
                kept["biased"] = wm
    else:
        wm = w.reshape(group, m // group, k)
    k1 = c * kh * kw + ones
    per_image = k1 * p * x.dtype.itemsize
    nb = max(1, min(n, IM2COL_BYTES // max(per_image, 1)))
    fn = _kernel(cp, x.dtype, "onnxrt_im2col")
    # about eight positions per thread: short blocks cost more to schedule than they copy
    threads = min(256, -(-p // 32) * 32)
    i32 = np.int32
    # float16: CuPy's product of one matrix by a stack of them ran 509 us on an H100 for a
    # 3x3 layer at batch 32 (PyTorch's 115); one 2-D product over every image's columns,
    # then a transposing copy of the output, takes the fast path
    flat = x.dtype == np.float16 and group == 1
    cols = cp.empty((nb, k1, p), dtype=x.dtype)
    for n0 in range(0, n, nb):
        cnt = min(nb, n - n0)
        cc = cols[:cnt]
        fn((min(-(-p // (threads * 8)), 1024), min(cnt * k1, 65535)), (threads,),
           (x[n0:n0 + cnt], cc, i32(c), i32(h), i32(wd), i32(oh), i32(ow), i32(kh), i32(kw), i32(strides[0]),
            i32(strides[1]), i32(begin[0]), i32(begin[1]), i32(dil[0]), i32(dil[1]), i32(cnt), i32(ones), i32(flat)))
        out = y[n0:n0 + cnt]
        if flat:
            wide = cc.reshape(k1, cnt * p)
            if cnt == 1:
                cp.matmul(wm, wide, out=out.reshape(m, p))
            else:
                out.reshape(cnt, m, p)[...] = cp.matmul(wm, wide).reshape(m, cnt, p).transpose(1, 0, 2)
        elif ones or group == 1:
            cp.matmul(wm, cc, out=out.reshape(cnt, m, p))
        else:
            cp.matmul(wm[None], cc.reshape(cnt, group, k, p), out=out.reshape(cnt, group, m // group, p))
    if b is not None and not ones:
        y += b.reshape(1, m, 1, 1).astype(y.dtype, copy=False)
    return y


def layer_norm_rows(cp, x, scale, bias, eps: float, d: int):
    """``(y, mean, inv_std)`` normalizing contiguous rows of ``d`` values; mean and
    inv_std are one value per row."""
    x = cp.ascontiguousarray(x)
    rows = x.size // d if d else 0
    y = cp.empty_like(x)
    acc = TYPES[x.dtype][1]
    mean = cp.empty(rows, dtype=acc)
    inv = cp.empty(rows, dtype=acc)
    if rows:
        sc = cp.ascontiguousarray(scale.astype(x.dtype, copy=False)).reshape(-1)
        bb = cp.ascontiguousarray(bias.astype(x.dtype, copy=False)).reshape(-1) if bias is not None else sc
        threads = 128 if d <= 1024 else 256
        _kernel(cp, x.dtype, "onnxrt_layer_norm")(
            (_blocks(rows, 1),), (threads,),
            (x, sc, bb, y, mean, inv, np.int64(rows), np.int32(d), acc.type(eps), np.int32(bias is not None)))
    return y, mean, inv


def softmax_rows(cp, x, d: int, log: bool):
    """Softmax (or LogSoftmax) over contiguous rows of ``d`` values."""
    x = cp.ascontiguousarray(x)
    rows = x.size // d if d else 0
    y = cp.empty_like(x)
    if rows:
        threads = 32 if d <= 64 else 128 if d <= 1024 else 256
        _kernel(cp, x.dtype, "onnxrt_softmax")(
            (_blocks(rows, 1),), (threads,),
            (x, y, np.int64(rows), np.int32(d), np.int32(log), TYPES[x.dtype][1].type(-np.inf)))
    return y
