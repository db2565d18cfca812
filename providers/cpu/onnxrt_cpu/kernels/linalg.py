"""Matrix products: MatMul, Gemm and com.microsoft FusedMatMul.

Both hand the work to ``np.matmul`` so a BLAS library does it. Half-precision floats
(float16, bfloat16) are multiplied in float32 and rounded once at the end, which is
both more accurate and far faster than numpy's element-by-element half loops.
Constant right-hand operands are prepacked once per node: converted to the compute
dtype and, for Gemm, transposed into a contiguous matrix with ``alpha`` folded in,
so a run is one matmul plus the bias.
"""

from __future__ import annotations

import math

import numpy as np
from onnxrt.plugin.kernel import Kernel
from onnxrt.run.limits import allocation_limit, check_allocation

from ..parallel import PARALLEL_MIN_FLOPS, matmul_nd
from ..registry import op
from ..rows import row_op

__all__ = ["MatMul", "Gemm", "FusedMatMul"]

#: the types Gemm's lean run takes (those BLAS multiplies in place)
_LEAN_TYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _compute_dtype(dt: np.dtype) -> np.dtype:
    """The dtype a product of ``dt`` operands is computed in."""
    if dt.kind == "f" and dt.itemsize >= 4:
        return dt
    if dt.kind in "iub":
        return dt
    # float16 and the ml_dtypes floats
    return np.dtype(np.float32)


def _as_compute(x: np.ndarray, cdt: np.dtype) -> np.ndarray:
    return x if x.dtype == cdt else x.astype(cdt)


def _check_product(k, a: np.ndarray, b: np.ndarray, cdt: np.dtype) -> None:
    """Refuse a product over the allocation cap before it is made: ``[N, 1] @ [1, N]``
    (or ``[N, 0] @ [0, N]``, from empty operands) is ``N * N`` values. The batch of
    the result is at most the product of the operands' batches, a cheap bound that
    decides whether the exact shape is worth computing."""
    m = a.shape[-2] if a.ndim > 1 else 1
    n = b.shape[-1] if b.ndim > 1 else 1
    bound = m * n * math.prod(a.shape[:-2]) * math.prod(b.shape[:-2]) * cdt.itemsize
    if bound > allocation_limit():
        batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        check_allocation((*batch, m, n), cdt, f"{k.node.op_type} output")


@op("MatMul", since=1)
class MatMul(Kernel):
    """Matrix product with numpy ``matmul`` semantics (1-D operands, broadcast batches)."""

    def setup(self):
        b = self.node.constants.get(1)
        self.b_packed = None
        if b is not None and b.ndim >= 1:
            cdt = _compute_dtype(b.dtype)
            self.b_packed = np.ascontiguousarray(_as_compute(b, cdt))

    def run(self, a, b):
        if a.dtype != b.dtype:
            raise ValueError(f"{self.node.describe()}: operands have different dtypes {a.dtype} and {b.dtype}")
        if a.ndim == 0 or b.ndim == 0:
            raise ValueError(
                f"{self.node.describe()}: operands must have rank >= 1, got shapes {a.shape} and {b.shape}"
            )
        out_dt = a.dtype
        cdt = _compute_dtype(out_dt)
        _check_product(self, a, b, cdt)
        bb = self.b_packed if self.b_packed is not None and self.b_packed.shape == b.shape else _as_compute(b, cdt)
        try:
            y = matmul_nd(_as_compute(a, cdt), bb)
        except ValueError as e:
            raise ValueError(
                f"{self.node.describe()}: cannot multiply shapes {a.shape} and {b.shape}: {e}"
            ) from None
        # 1-D @ 1-D gives a numpy scalar; outputs are always arrays
        y = np.asarray(y)
        return (y if y.dtype == out_dt else y.astype(out_dt),)


@op("Gemm", since=1)
class Gemm(Kernel):
    """``Y = alpha * A' @ B' + beta * C`` with optional transposes and a broadcast ``C``."""

    def setup(self):
        a = self.attrs
        self.alpha = float(a.get("alpha", 1.0))
        self.beta = float(a.get("beta", 1.0))
        self.trans_a = bool(a.get("transA", 0))
        self.trans_b = bool(a.get("transB", 0))
        self.b_packed = None
        self.alpha_in_b = False
        b = self.node.constants.get(1)
        if b is not None and b.ndim == 2:
            cdt = _compute_dtype(b.dtype)
            bp = _as_compute(b, cdt)
            bp = bp.T if self.trans_b else bp
            if cdt.kind == "f" and self.alpha != 1.0:
                bp = bp * cdt.type(self.alpha)
                self.alpha_in_b = True
            self.b_packed = np.ascontiguousarray(bp)
        self.c_packed = None
        c = self.node.constants.get(2)
        if c is not None and self.beta != 0.0:
            cdt = _compute_dtype(c.dtype)
            if cdt.kind == "f":
                self.c_packed = _as_compute(c, cdt) * cdt.type(self.beta)
        # The lean run: a float32/float64 A of B's type times the prepacked B (alpha in
        # it), plus the prepacked bias row where there is one, none of the general run's
        # dtype and broadcast logic per call (a small model's Gemm spent 4-7 us there,
        # more than its product). Set where B is packed in its own type and C is absent
        # or a prepacked row ([N] or [1, N]) that broadcasts to any M.
        self.lean = None
        bp = self.b_packed
        if (bp is not None and bp.dtype in _LEAN_TYPES and (self.alpha == 1.0 or self.alpha_in_b)
                and (b is not None and b.dtype == bp.dtype)):
            n = bp.shape[1]
            cp = self.c_packed
            if self.beta == 0.0 or len(self.node.inputs) < 3 or not self.node.inputs[2]:
                self.lean = (bp, None, None)
            elif (cp is not None and cp.dtype == bp.dtype and cp.ndim in (1, 2) and cp.shape[-1] == n
                  and (cp.ndim == 1 or cp.shape[0] == 1)):
                self.lean = (bp, cp, cp.shape)

    def run(self, a, b, c=None):
        lean = self.lean
        if lean is not None and type(a) is np.ndarray and a.ndim == 2:
            bp, cp, c_shape = lean
            if a.dtype == bp.dtype and (cp is None or (c is not None and c.shape == c_shape)):
                aa = a.T if self.trans_a else a
                m, k = aa.shape
                n = bp.shape[1]
                if k == bp.shape[0] and m * n * bp.itemsize <= allocation_limit():
                    y = np.matmul(aa, bp) if m * k * n < PARALLEL_MIN_FLOPS else matmul_nd(aa, bp)
                    if cp is not None and (m == 1 or row_op(np.add, y, cp) is None):
                        np.add(y, cp, out=y)
                    return (y,)
        return self._run(a, b, c)

    def _run(self, a, b, c=None):
        desc = self.node.describe()
        if a.ndim != 2 or b.ndim != 2:
            raise ValueError(f"{desc}: A and B must be 2-D, got shapes {a.shape} and {b.shape}")
        out_dt = a.dtype
        cdt = _compute_dtype(out_dt)
        aa = _as_compute(a, cdt)
        if self.trans_a:
            aa = aa.T
        if self.b_packed is not None and self.b_packed.dtype == cdt:
            bb, alpha_done = self.b_packed, self.alpha_in_b
        else:
            bb = _as_compute(b, cdt)
            if self.trans_b:
                bb = bb.T
            alpha_done = False
        if aa.shape[1] != bb.shape[0]:
            raise ValueError(
                f"{desc}: inner dimensions differ: A' is {aa.shape}, B' is {bb.shape} "
                f"(transA={int(self.trans_a)}, transB={int(self.trans_b)})"
            )
        if aa.shape[0] * bb.shape[1] * cdt.itemsize > allocation_limit():
            check_allocation((aa.shape[0], bb.shape[1]), cdt, "Gemm output")  # [M, 0] x [0, N] too
        y = matmul_nd(aa, bb)
        if cdt.kind == "f":
            if not alpha_done and self.alpha != 1.0:
                y *= cdt.type(self.alpha)
        elif self.alpha != 1.0:
            y = (y * self.alpha).astype(cdt)
        if c is not None and self.beta != 0.0:
            m, n = y.shape
            if c.ndim > 2 or any(d not in (1, t) for d, t in zip(c.shape[::-1], (n, m))):
                raise ValueError(f"{desc}: C of shape {c.shape} does not broadcast to the output shape {y.shape}")
            if self.c_packed is not None and self.c_packed.shape == c.shape and self.c_packed.dtype == cdt:
                if row_op(np.add, y, self.c_packed) is None:  # a bias row: one long loop
                    y += self.c_packed
            elif cdt.kind == "f":
                cc = _as_compute(c, cdt)
                y += cc if self.beta == 1.0 else cc * cdt.type(self.beta)
            elif self.beta == 1.0:
                y += c.astype(cdt, copy=False)
            else:
                y = (y + c * self.beta).astype(cdt)
        return (y if y.dtype == out_dt else y.astype(out_dt),)


def _no_batch_transpose(node) -> str | None:
    if node.attrs.get("transBatchA", 0) or node.attrs.get("transBatchB", 0):
        return "transBatchA/transBatchB are not supported"
    return None


@op("FusedMatMul", since=1, domain="com.microsoft", accepts=_no_batch_transpose)
class FusedMatMul(Kernel):
    """``alpha * A' @ B'`` where ``'`` optionally swaps the last two axes."""

    def setup(self):
        a = self.attrs
        self.alpha = float(a.get("alpha", 1.0))
        self.trans_a = bool(a.get("transA", 0))
        self.trans_b = bool(a.get("transB", 0))
        self.b_packed = None
        b = self.node.constants.get(1)
        if b is not None and b.ndim >= 2:
            cdt = _compute_dtype(b.dtype)
            bp = _as_compute(b, cdt)
            if self.trans_b:
                bp = bp.swapaxes(-1, -2)
            if self.alpha != 1.0:
                bp = bp * cdt.type(self.alpha)
            self.b_packed = np.ascontiguousarray(bp)

    def run(self, a, b):
        desc = self.node.describe()
        if a.dtype != b.dtype:
            raise ValueError(f"{desc}: operands have different dtypes {a.dtype} and {b.dtype}")
        out_dt = a.dtype
        cdt = _compute_dtype(out_dt)
        aa = _as_compute(a, cdt)
        if self.trans_a and aa.ndim >= 2:
            aa = aa.swapaxes(-1, -2)
        if self.b_packed is not None and self.b_packed.dtype == cdt and b.ndim == self.b_packed.ndim:
            bb, alpha_done = self.b_packed, True
        else:
            bb = _as_compute(b, cdt)
            if self.trans_b and bb.ndim >= 2:
                bb = bb.swapaxes(-1, -2)
            alpha_done = False
        try:
            y = matmul_nd(aa, bb)
        except ValueError as e:
            raise ValueError(f"{desc}: cannot multiply shapes {a.shape} and {b.shape}: {e}") from None
        if not alpha_done and self.alpha != 1.0:
            y *= cdt.type(self.alpha)
        return (y if y.dtype == out_dt else y.astype(out_dt),)
