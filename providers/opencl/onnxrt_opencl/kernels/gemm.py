"""Matrix products on the device: Gemm and MatMul, and the GEMM routine Conv reuses.

Two OpenCL kernels do every product, both register-blocked: when ``B``'s columns
are contiguous (MatMul, Conv's columns) each work-item holds 8 rows of 16
columns in ``float16`` vector registers (fewer rows for skinny products);
otherwise each holds an ``8 x 8`` block whose columns interleave across the
work-group, so neighbouring work-items read neighbouring addresses. Operands are
read through ``(row, column)`` strides, so transposed operands (``transA``, the
ConvTranspose weight) need no copy; a constant ``transB`` weight is transposed
once. A third launch dimension walks up to two batch dimensions
(``b = b_hi * nb_lo + b_lo``), each with its own stride per operand, which covers
MatMul's broadcast batches and Conv's (image, group) pairs; a zero stride
broadcasts. The epilogue fuses ``alpha``, ``beta * bias`` (a broadcast bias read
through its own strides) and the store.

Register blocking without local memory suits CPU OpenCL devices: on PoCL the
vector kernel ran about 40 GFLOP/s on two cores, four times the interleaved
scalar kernel and eight times a 16x16 local-memory tiled kernel. When
``pyclblast`` is installed, plain 2-D products go to CLBlast instead.
"""

from __future__ import annotations

import numpy as np
from onnxrt.errors import InvalidArgument

from ..registry import op
from .base import CLKernel

__all__ = ["ACTIVATIONS", "FLOATS", "PARAMS_DECL", "FusedGemm", "Gemm", "MatMul", "Operand", "activation_ok", "dev", "fp_options", "gemm", "launch_size", "params"]

try:  # optional tuned BLAS; never required
    import pyclblast as _clblast  # type: ignore[import-not-found]
except Exception:  # noqa: BLE001 - a broken install must not break the provider
    _clblast = None

#: the element types the compute kernels register for (float64 only runs where the
#: device has it; the provider refuses float64 nodes elsewhere)
FLOATS = (np.float32, np.float64)
_WN = 8
_L0 = 8


def _rows_per_item(m: int) -> int:
    """Rows per work-item: 8 for real matrices, fewer for the skinny ones (matrix-vector)."""
    return 8 if m >= 8 else (4 if m >= 4 else 1)

#: every kernel of this package's compute modules takes its integer (and float, as
#: bits) parameters in one struct passed by value: PoCL's launch cost grows by tens
#: of microseconds per kernel argument, so 30 scalar arguments cost a millisecond.
#: ``real`` is the element type: float, or double when built with ``-DUSE_FP64``.
PARAMS_DECL = r"""
#ifdef USE_FP64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
typedef double real;
typedef double16 real16;
#else
typedef float real;
typedef float16 real16;
#endif
typedef struct { int v[40]; } Params;
#define PI(i) (p.v[i])
#define PF(i) as_float(p.v[i])
"""

_N_PARAMS = 40

#: the activations a fused epilogue applies (onnxruntime's FusedConv/FusedGemm names)
ACTIVATIONS = {
    "": 0, "Relu": 1, "Sigmoid": 2, "Tanh": 3, "LeakyRelu": 4, "Clip": 5, "HardSigmoid": 6, "Elu": 7,
    "ThresholdedRelu": 8, "ScaledTanh": 9,
}

#: ``activate(code, v, p0, p1)``: the fused epilogue's activation (codes: ACTIVATIONS)
ACTIVATION_DECL = r"""
inline real activate(const int code, const real v, const real p0, const real p1) {
    switch (code) {
    case 1: return v < 0 ? (real)0 : v;
    case 2: return 1 / (1 + exp(-v));
    case 3: return tanh(v);
    case 4: return v >= 0 ? v : v * p0;
    case 5: return fmin(fmax(v, p0), p1);
    case 6: return clamp(v * p0 + p1, (real)0, (real)1);
    case 7: return v >= 0 ? v : p0 * (exp(v) - 1);
    case 8: return v > p0 ? v : (real)0;
    case 9: return p0 * tanh(v * p1);
    default: return v;
    }
}
"""

GEMM_SOURCE = PARAMS_DECL + ACTIVATION_DECL + r"""
/* Params: M N K nb_lo | offA sAh sAl sAm sAk | offB sBh sBl sBk sBn | offC sCh sCl sCm |
   offD sDh sDl sDm sDn | has_bias alpha beta | has_z offZ act p0 p1.
   Z (a residual added before the activation) is laid out like C. */
#define GEMM_PARAMS \
    const int M = PI(0), N = PI(1), K = PI(2), nb_lo = PI(3); \
    const int sAm = PI(7), sAk = PI(8), sBk = PI(12), sBn = PI(13), sCm = PI(17); \
    const int sDm = PI(21), sDn = PI(22), has_bias = PI(23); \
    const real alpha = PF(24), beta = PF(25); \
    const int has_z = PI(26), act = PI(28); \
    const real p0 = PF(29), p1 = PF(30);
#define GEMM_BATCH \
    const int b = get_global_id(2); \
    const int bh = b / nb_lo, bl = b - bh * nb_lo; \
    A += PI(4) + bh * PI(5) + bl * PI(6); \
    B += PI(9) + bh * PI(10) + bl * PI(11);
#define GEMM_OUT \
    C += PI(14) + bh * PI(15) + bl * PI(16); \
    Z += PI(27) + bh * PI(15) + bl * PI(16); \
    if (has_bias) D += PI(18) + bh * PI(19) + bl * PI(20);
#define GEMM_STORE(v, m, n) { \
    if (has_bias) v = mad(beta, D[(m) * sDm + (n) * sDn], v); \
    if (has_z) v += Z[(m) * sCm + (n)]; \
    C[(m) * sCm + (n)] = activate(act, v, p0, p1); }

/* WM rows x WN columns per work-item; the columns of one work-group interleave
   (work-item t takes base + t + j * L0) so neighbouring work-items read
   neighbouring addresses of B and C. WM, WN and L0 come as build options. */
__kernel __attribute__((reqd_work_group_size(L0, 1, 1)))
void gemm(__global const real* A, __global const real* B, __global real* C, __global const real* D,
          __global const real* Z, const Params p)
{
    GEMM_PARAMS
    const int base = get_group_id(0) * L0 * WN + get_local_id(0);
    const int m0 = get_global_id(1) * WM;
    if (m0 >= M) return;
    GEMM_BATCH
    real acc[WM][WN];
    int ra[WM], cb[WN];
    /* ragged edges: clamp the reads, drop them at the store */
    for (int i = 0; i < WM; i++) ra[i] = min(m0 + i, M - 1) * sAm;
    for (int j = 0; j < WN; j++) cb[j] = min(base + j * L0, N - 1) * sBn;
    for (int i = 0; i < WM; i++) for (int j = 0; j < WN; j++) acc[i][j] = 0.0f;
    for (int k = 0; k < K; k++) {
        real a[WM], bb[WN];
        for (int i = 0; i < WM; i++) a[i] = A[ra[i] + k * sAk];
        for (int j = 0; j < WN; j++) bb[j] = B[k * sBk + cb[j]];
        for (int i = 0; i < WM; i++)
            for (int j = 0; j < WN; j++) acc[i][j] = mad(a[i], bb[j], acc[i][j]);
    }
    GEMM_OUT
    for (int i = 0; i < WM; i++) {
        const int m = m0 + i;
        if (m >= M) break;
        for (int j = 0; j < WN; j++) {
            const int n = base + j * L0;
            if (n >= N) break;
            real v = alpha * acc[i][j];
            GEMM_STORE(v, m, n)
        }
    }
}

/* The same product for a B with unit column stride: each work-item holds WM rows of
   16 contiguous columns in vector registers (one vector load of B and WM scalar
   loads of A feed WM vector multiply-adds per k). */
__kernel void gemm_vec(__global const real* A, __global const real* B, __global real* C,
                       __global const real* D, __global const real* Z, const Params p)
{
    GEMM_PARAMS
    const int n0 = get_global_id(0) * 16;
    const int m0 = get_global_id(1) * WM;
    if (m0 >= M || n0 >= N) return;
    GEMM_BATCH
    real16 acc[WM];
    int ra[WM];
    for (int i = 0; i < WM; i++) { acc[i] = (real16)(0.0f); ra[i] = min(m0 + i, M - 1) * sAm; }
    if (n0 + 16 <= N) {
        for (int k = 0; k < K; k++) {
            const real16 bv = vload16(0, B + k * sBk + n0);
            for (int i = 0; i < WM; i++) acc[i] = mad((real16)(A[ra[i] + k * sAk]), bv, acc[i]);
        }
    } else {
        real bt[16];
        for (int k = 0; k < K; k++) {
            for (int j = 0; j < 16; j++) bt[j] = B[k * sBk + min(n0 + j, N - 1)];
            const real16 bv = vload16(0, bt);
            for (int i = 0; i < WM; i++) acc[i] = mad((real16)(A[ra[i] + k * sAk]), bv, acc[i]);
        }
    }
    GEMM_OUT
    for (int i = 0; i < WM; i++) {
        const int m = m0 + i;
        if (m >= M) break;
        real t[16];
        vstore16(acc[i], 0, t);
        for (int j = 0; j < 16; j++) {
            const int n = n0 + j;
            if (n >= N) break;
            real v = alpha * t[j];
            GEMM_STORE(v, m, n)
        }
    }
}
"""

_I32_MAX = 2**31 - 1


def dev(a) -> tuple:
    """``(buffer, element offset)`` of a device array, for kernels taking explicit offsets.

    :raises InvalidArgument: the array is not C-contiguous (kernels here read flat buffers).
    """
    if not a.flags.c_contiguous:
        raise InvalidArgument(f"OpenCL kernels need C-contiguous arrays, got strides {a.strides} for shape {a.shape}")
    if a.size > _I32_MAX:
        raise InvalidArgument(f"OpenCL kernels index with 32-bit ints; an array of {a.size} elements is too large")
    return a.base_data, np.int32(a.offset // a.dtype.itemsize)


def params(*values) -> np.ndarray:
    """The ``Params`` struct of a kernel: ints as they are, floats as their float32 bits."""
    if len(values) > _N_PARAMS:
        raise ValueError(f"{len(values)} kernel parameters; the struct holds {_N_PARAMS}")
    out = np.zeros(_N_PARAMS, np.int32)
    for i, v in enumerate(values):
        if isinstance(v, (float, np.floating)):
            out[i] = np.float32(v).view(np.int32)
        else:
            out[i] = int(v)
    return out


def fp_options(dtype) -> tuple[str, ...]:
    """Build options selecting a program's element type ``real`` for ``dtype``."""
    return ("-DUSE_FP64",) if np.dtype(dtype) == np.float64 else ()


def launch_size(n: int, local: int) -> int:
    """``n`` rounded up to a multiple of ``local``."""
    return -(-int(n) // local) * local


class Operand:
    """A matrix operand of :func:`gemm`: a buffer, an element offset and four strides.

    ``sh``/``sl`` are the strides of the outer and inner batch index, ``s0``/``s1``
    those of the row and column (a zero stride broadcasts).
    """

    __slots__ = ("buf", "off", "s0", "s1", "sh", "sl")

    def __init__(self, buf, off, sh=0, sl=0, s0=0, s1=1):
        self.buf, self.off = buf, int(off)
        self.sh, self.sl, self.s0, self.s1 = int(sh), int(sl), int(s0), int(s1)

    @classmethod
    def of(cls, a, sh=0, sl=0, s0=0, s1=1, extra_offset=0):
        """An operand reading device array ``a`` (offset taken from the array)."""
        buf, off = dev(a)
        return cls(buf, int(off) + extra_offset, sh, sl, s0, s1)

    def ints(self, with_col=True) -> list:
        head = [self.off, self.sh, self.sl, self.s0]
        return head + [self.s1] if with_col else head


def gemm(rt, M, N, K, a: Operand, b: Operand, c: Operand, bias: Operand | None = None,
         alpha=1.0, beta=1.0, nb_hi=1, nb_lo=1, dtype=np.float32, z: tuple | None = None,
         activation: tuple = (0, 0.0, 0.0)) -> None:
    """Enqueue ``C[b] = act(alpha * A[b] @ B[b] + beta * bias[b] + Z[b])`` for ``nb_hi * nb_lo`` batches.

    ``c`` must have a unit column stride (its ``s1`` is ignored). ``z`` is
    ``(buffer, offset)`` of a residual laid out like ``c``; ``activation`` is
    ``(code, p0, p1)`` with a code from :data:`ACTIVATIONS`. Nothing is enqueued for
    an empty product; ``K == 0`` writes the epilogue of zero.
    """
    if M <= 0 or N <= 0 or nb_hi * nb_lo <= 0:
        return
    wm = _rows_per_item(M)
    prg = rt.program(GEMM_SOURCE, (f"-DWM={wm}", f"-DWN={_WN}", f"-DL0={_L0}", *fp_options(dtype)))
    d = bias if bias is not None else Operand(c.buf, 0, 0, 0, 0, 0)
    if b.s1 == 1:
        name, gsize, lsize = "gemm_vec", (-(-N // 16), -(-M // wm), nb_hi * nb_lo), None
    else:
        name, gsize, lsize = "gemm", (-(-N // (_L0 * _WN)) * _L0, -(-M // wm), nb_hi * nb_lo), (_L0, 1, 1)
    rt.launch(
        prg, name, gsize, lsize, a.buf, b.buf, c.buf, d.buf, z[0] if z is not None else c.buf,
        params(M, N, K, nb_lo, *a.ints(), *b.ints(), *c.ints(with_col=False), *d.ints(),
               int(bias is not None), float(alpha), float(beta), int(z is not None), int(z[1]) if z else 0,
               int(activation[0]), float(activation[1]), float(activation[2])),
    )


def _clblast_gemm(rt, M, N, K, a, b, c) -> bool:
    """``C = A @ B`` on CLBlast for offset-free row-major operands; ``False`` when it
    is not installed or declines (the built-in kernel then runs)."""
    if _clblast is None or a.offset or b.offset or c.offset:
        return False
    try:
        _clblast.gemm(rt.queue, M, N, K, a.reshape(M, K), b.reshape(K, N), c.reshape(M, N), K, N, N)
    except Exception:  # noqa: BLE001 - fall back to the built-in kernel
        return False
    return True


# -- MatMul -----------------------------------------------------------------------------


def _merge_batch(shape, *strides):
    """Merge adjacent batch dims whose strides chain for every operand; drop size-1 dims."""
    dims = [(s, [st[i] for st in strides]) for i, s in enumerate(shape) if s != 1]
    out: list = []
    for size, st in dims:
        if out:
            psize, pst = out[-1]
            if all(p == q * size for p, q in zip(pst, st)):
                out[-1] = (psize * size, st)
                continue
        out.append((size, st))
    return out


def _batch_strides(bshape, out_batch, mat_size):
    """Strides (in elements) of an operand's batch dims broadcast to ``out_batch``."""
    nd = len(out_batch)
    bshape = (1,) * (nd - len(bshape)) + tuple(bshape)
    st, acc = [0] * nd, mat_size
    for i in reversed(range(nd)):
        st[i] = 0 if bshape[i] == 1 else acc
        acc *= bshape[i]
    return st


def matmul(rt, a, b, desc: str = "MatMul"):
    """``numpy.matmul`` of two device arrays (1-D operands and broadcast batches included)."""
    if a.dtype != b.dtype:
        raise InvalidArgument(f"{desc}: operands have different dtypes {a.dtype} and {b.dtype}")
    if a.ndim == 0 or b.ndim == 0:
        raise InvalidArgument(f"{desc}: operands must have rank >= 1, got shapes {a.shape} and {b.shape}")
    ash = (1,) + a.shape if a.ndim == 1 else a.shape
    bsh = b.shape + (1,) if b.ndim == 1 else b.shape
    M, K = ash[-2:]
    K2, N = bsh[-2:]
    if K != K2:
        raise InvalidArgument(f"{desc}: cannot multiply shapes {a.shape} and {b.shape} (inner sizes {K} and {K2})")
    try:
        batch = np.broadcast_shapes(ash[:-2], bsh[:-2])
    except ValueError:
        raise InvalidArgument(f"{desc}: batch dims of {a.shape} and {b.shape} do not broadcast") from None
    out_shape = tuple(batch) + ((M,) if a.ndim > 1 else ()) + ((N,) if b.ndim > 1 else ())
    y = rt.empty(out_shape, a.dtype)
    if y.size == 0:
        return y
    if K == 0:
        y.fill(0)
        return y
    sa = _batch_strides(ash[:-2], batch, M * K)
    sb = _batch_strides(bsh[:-2], batch, K * N)
    sc = _batch_strides(batch, batch, M * N)
    dims = _merge_batch(batch, sa, sb, sc)
    ab, aoff = dev(a)
    bb, boff = dev(b)
    cb, coff = dev(y)
    if len(dims) == 1 and dims[0][1][1] == 0 and dims[0][1][0] == M * K:
        # B is shared by every batch and A is one contiguous stack: one tall product
        dims, M = [], M * dims[0][0]
    if not dims and _clblast_gemm(rt, M, N, K, a, b, y):
        return y
    while len(dims) < 2:
        dims.insert(0, (1, [0, 0, 0]))
    outer = dims[:-2]
    (nh, sth), (nl, stl) = dims[-2], dims[-1]
    for idx in np.ndindex(*[d[0] for d in outer]):
        extra = [sum(int(j) * d[1][k] for j, d in zip(idx, outer)) for k in range(3)]
        gemm(
            rt, M, N, K,
            Operand(ab, int(aoff) + extra[0], sth[0], stl[0], K, 1),
            Operand(bb, int(boff) + extra[1], sth[1], stl[1], N, 1),
            Operand(cb, int(coff) + extra[2], sth[2], stl[2], N, 1),
            nb_hi=nh, nb_lo=nl, dtype=a.dtype,
        )
    return y


@op("MatMul", since=1, types={"T": FLOATS})
class MatMul(CLKernel):
    """``numpy.matmul`` semantics: 1-D operands, broadcast batch dims."""

    def run(self, a, b):
        return (matmul(self.rt, a, b, self.node.describe()),)


# -- Gemm ------------------------------------------------------------------------------


@op("Gemm", since=1, types={"T": FLOATS})
class Gemm(CLKernel):
    """``Y = alpha * A' @ B' + beta * C`` with optional transposes and a broadcast ``C``."""

    def setup(self):
        a = self.attrs
        self.alpha = float(a.get("alpha", 1.0))
        self.beta = float(a.get("beta", 1.0))
        self.trans_a = bool(a.get("transA", 0))
        self.trans_b = bool(a.get("transB", 0))
        self.b_packed = None

    def prepare(self):
        # A constant transposed B is transposed once, so every run reads contiguous columns
        b = self.constant(1)
        if self.trans_b and b is not None and b.ndim == 2 and b.dtype in FLOATS:
            self.b_packed = self.rt.to_device(np.ascontiguousarray(b.T))

    def run(self, a, b, c=None):
        return (self._product(a, b, c),)

    def _product(self, a, b, c, activation=(0, 0.0, 0.0)):
        desc = self.node.describe()
        if a.ndim != 2 or b.ndim != 2:
            raise InvalidArgument(f"{desc}: A and B must be 2-D, got shapes {a.shape} and {b.shape}")
        M, K = (a.shape[1], a.shape[0]) if self.trans_a else a.shape
        K2, N = (b.shape[1], b.shape[0]) if self.trans_b else b.shape
        if K != K2:
            raise InvalidArgument(
                f"{desc}: inner dimensions differ: A' is {(M, K)}, B' is {(K2, N)} "
                f"(transA={int(self.trans_a)}, transB={int(self.trans_b)})"
            )
        y = self.rt.empty((M, N), a.dtype)
        if y.size == 0:
            return y
        bias = None
        if c is not None and self.beta != 0.0 and c.size:
            bias = self._bias(c, M, N, desc)
        if K == 0 and bias is None and not activation[0]:
            y.fill(0)
            return y
        sa = (1, a.shape[1]) if self.trans_a else (a.shape[1], 1)
        if self.b_packed is not None and self.b_packed.shape == (K, N) and self.b_packed.dtype == b.dtype:
            b, sb = self.b_packed, (N, 1)
        else:
            sb = (1, b.shape[1]) if self.trans_b else (b.shape[1], 1)
        gemm(
            self.rt, M, N, K,
            Operand.of(a, s0=sa[0], s1=sa[1]),
            Operand.of(b, s0=sb[0], s1=sb[1]),
            Operand.of(y, s0=N),
            bias, self.alpha, self.beta, dtype=a.dtype, activation=activation,
        )
        return y

    @staticmethod
    def _bias(c, M, N, desc) -> Operand:
        shape = (1,) * (2 - c.ndim) + tuple(c.shape) if c.ndim <= 2 else None
        if shape is None or shape[0] not in (1, M) or shape[1] not in (1, N):
            raise InvalidArgument(f"{desc}: C of shape {c.shape} does not broadcast to ({M}, {N})")
        return Operand.of(c, s0=0 if shape[0] == 1 else shape[1], s1=0 if shape[1] == 1 else 1)


def activation_ok(node) -> str | None:
    """Refuse fused (com.microsoft) nodes of other types than float32/float64, or whose
    activation the epilogue does not know (their schemas are not onnx's, so ``types=``
    cannot check them)."""
    dt = node.input_dtype(0)
    if dt is not None and dt not in [np.dtype(t) for t in FLOATS]:
        return f"input 0 has type {dt}; the OpenCL {node.op_type} takes float32 or float64"
    name = node.attrs.get("activation", "")
    if name not in ACTIVATIONS:
        return f"activation {name!r} is not fused on OpenCL (known: {', '.join(sorted(ACTIVATIONS)[1:])})"
    return None


@op("FusedGemm", since=1, domain="com.microsoft", types={"T": FLOATS}, accepts=activation_ok)
class FusedGemm(Gemm):
    """``activation(alpha * A' @ B' + beta * C)``, the activation applied in the epilogue."""

    def setup(self):
        super().setup()
        a = self.attrs
        name = a.get("activation", "")
        if name == "Clip":
            raise InvalidArgument(f"{self.node.describe()}: FusedGemm does not take Clip")
        defaults = (0.2, 0.5) if name == "HardSigmoid" else (0.01 if name == "LeakyRelu" else 1.0, 1.0)
        self.activation = (
            ACTIVATIONS[name],
            float(a.get("activation_alpha", defaults[0])),
            float(a.get("activation_beta", defaults[1])),
        )

    def run(self, a, b, c=None):
        return (self._product(a, b, c, self.activation),)
