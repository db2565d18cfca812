"""com.microsoft MatMulNBits: a matrix product with 2-, 4- or 8-bit weights quantized
block-wise along K, each block with its own scale and zero point (the weight-only
quantization of large language models)."""

from __future__ import annotations

import numpy as np
from onnxrt.plugin.kernel import Kernel

from .. import native
from ..parallel import matmul_nd
from ..registry import op

__all__ = ["MatMulNBits"]

MS = "com.microsoft"
_F32 = np.dtype(np.float32)


def _unpack_bits(packed: np.ndarray, bits: int) -> np.ndarray:
    """Split each byte of ``packed`` into ``8 // bits`` values, lowest bits first."""
    per = 8 // bits
    shifts = (np.arange(per, dtype=np.uint8) * bits).astype(np.uint8)
    vals = (packed[..., None] >> shifts) & np.uint8((1 << bits) - 1)
    return vals.reshape(packed.shape[:-1] + (packed.shape[-1] * per,))


#: Smallest block maximum :func:`_int8_blocks` divides by: ``127 / amax`` stays finite.
_AMAX_FLOOR = np.float32(127) / np.finfo(np.float32).max


def _int8_blocks(a: np.ndarray, block: int) -> np.ndarray:
    """``a`` rounded as onnxruntime's int8 path rounds it: per row, per block of
    ``block`` values along the last axis, to the nearest (ties to even) multiple of
    ``max|a| / 127``, the codes taken as ``a * (127 / max|a|)``, both in float32."""
    k = a.shape[-1]
    kb = -(-k // block)
    rows = a.reshape(-1, k)
    if kb * block != k:
        padded = np.zeros((rows.shape[0], kb * block), _F32)
        padded[:, :k] = rows
        rows = padded
    blocks = rows.reshape(-1, kb, block)
    amax = np.maximum.reduce(np.abs(blocks), axis=-1, keepdims=True)
    # an all-zero block has no scale: its codes come out 0 against any finite factor
    # (the floor keeps 127 / amax finite; a block below it would be all but zero)
    inv = np.float32(127) / np.maximum(amax, _AMAX_FLOOR)
    codes = blocks * inv
    np.rint(codes, out=codes)
    codes *= amax / np.float32(127)
    return codes.reshape(-1, kb * block)[:, :k].reshape(a.shape)


@op("MatMulNBits", since=1, domain=MS)
class MatMulNBits(Kernel):
    """``A @ dequantize(B)^T + bias`` where B ``[N, K]`` is stored in blocks of
    ``block_size`` along K, each ``bits`` wide with its own scale and zero point.

    A constant B is dequantized once, in ``setup``, to a float32 ``[K, N]`` matrix, so
    a run is one BLAS product.
    """

    def setup(self):
        a = self.attrs
        desc = self._desc = self.node.describe()
        try:
            self.k, self.n = int(a["K"]), int(a["N"])
            self.block = int(a["block_size"])
        except KeyError as e:
            raise ValueError(f"{desc}: attribute {e.args[0]} is required") from None
        self.bits = int(a.get("bits", 4))
        if self.bits not in (2, 4, 8):
            raise ValueError(f"{desc}: bits must be 2, 4 or 8, got {self.bits}")
        if self.block < 16 or self.block & (self.block - 1):
            raise ValueError(
                f"{desc}: block_size must be a power of 2 >= 16, got {self.block}"
            )
        # accuracy_level 4 lets A be rounded to int8, and onnxruntime's x86 kernels do
        # so wherever they have an int8 path (4 and 8 bits; 2 bits in blocks of 32 to
        # 128): emulated, the results follow onnxruntime's to float rounding, where the
        # exact product was 1e-3 to 1e-2 of the output's range away (and greedy decoding
        # of a 4-bit language model picked other tokens after a step or two)
        self.int8_a = int(a.get("accuracy_level", 0)) == 4 and (self.bits != 2 or 32 <= self.block <= 128)
        c = self.node.constants
        ins = self.node.inputs
        self.w = None
        opt = [i for i in (3,) if i < len(ins) and ins[i]]
        self.w8 = None
        if 1 in c and 2 in c and all(i in c for i in opt):
            self.w = self._dequantize(c[1], c[2], c.get(3) if opt else None)
            if self.int8_a and self.bits in (2, 4):
                # A's int8 blocks times the weight's centred codes in integers, where
                # this CPU has 8-bit products
                self.w8 = self._pack_int8(c[1], c[2], c.get(3) if opt else None)

    def _pack_int8(self, b, scales, zero_points):
        """The constant weight's codes minus their zero points (int8 ``[N, blocks *
        block]``, zeros past K) and its scales, packed for the compiled kernel; None
        for float zero points or where the CPU has no 8-bit products. Called after
        :meth:`_dequantize` checked the arrays."""
        n, k, bits, block = self.n, self.k, self.bits, self.block
        kb = -(-k // block)
        q = _unpack_bits(b.reshape(n, kb, block * bits // 8), bits).astype(np.int16)
        if zero_points is None:
            q -= 1 << (bits - 1)
        elif zero_points.dtype == np.uint8:
            z = _unpack_bits(zero_points.reshape(n, -(-kb * bits // 8)), bits)[:, :kb].astype(np.int16)
            q -= z[..., None]
        else:
            return None  # float zero points: the codes are not integers after them
        centred = q.reshape(n, kb * block)
        centred[:, k:] = 0
        return native.pack_nbits_weights(centred.astype(np.int8), np.asarray(scales).astype(_F32).reshape(n, kb), k,
                                         block)

    def _dequantize(self, b, scales, zero_points) -> np.ndarray:
        desc = self.node.describe()
        n, k, bits, block = self.n, self.k, self.bits, self.block
        kb = -(-k // block)
        blob = block * bits // 8
        if b.dtype != np.uint8 or b.size != n * kb * blob:
            raise ValueError(
                f"{desc}: B must be uint8 of shape ({n}, {kb}, {blob}), got {b.dtype} {b.shape}"
            )
        q = _unpack_bits(b.reshape(n, kb, blob), bits).astype(_F32)  # [N, kb, block]
        s = np.asarray(scales)
        if s.size != n * kb:
            raise ValueError(
                f"{desc}: scales must have {n * kb} values (N x k_blocks), got shape {s.shape}"
            )
        s = s.astype(_F32).reshape(n, kb, 1)
        if zero_points is None:
            q -= np.float32(1 << (bits - 1))
        elif zero_points.dtype == np.uint8:
            zb = -(-kb * bits // 8)
            if zero_points.size != n * zb:
                raise ValueError(
                    f"{desc}: packed zero_points must have {n * zb} bytes, got shape {zero_points.shape}"
                )
            z = _unpack_bits(zero_points.reshape(n, zb), bits)[:, :kb].astype(_F32)
            q -= z[..., None]
        else:
            if zero_points.size != n * kb:
                raise ValueError(
                    f"{desc}: zero_points must have {n * kb} values, got shape {zero_points.shape}"
                )
            # float zero points are in the dequantized domain offset: (q - zp) * s
            q -= zero_points.astype(_F32).reshape(n, kb, 1)
        q *= s
        w = q.reshape(n, kb * block)[:, :k]
        return np.ascontiguousarray(w.T)  # [K, N]

    def run(self, a, b, scales, zero_points=None, g_idx=None, bias=None):
        desc = self._desc
        if g_idx is not None:
            raise ValueError(f"{desc}: g_idx is deprecated and not supported")
        if a.shape[-1] != self.k:
            raise ValueError(
                f"{desc}: A's last dimension is {a.shape[-1]}, K is {self.k}"
            )
        af = a.astype(_F32, copy=False)
        if self.w8 is not None and (bias is None or (bias.shape == (self.n,) and bias.dtype == _F32)):
            y = native.nbits_matmul(af, self.w8, bias)
            if y is not None:
                return (y.astype(a.dtype, copy=False),)
        w = self.w if self.w is not None else self._dequantize(b, scales, zero_points)
        if self.int8_a:
            # the compiled rounding is one pass; numpy's is about ten calls, most of a
            # generation step's node (the tiny 4-bit Llama's: 24 -> about 8 us)
            rounded = native.int8_blocks(af, self.block)
            af = rounded if rounded is not None else _int8_blocks(af, self.block)
        y = matmul_nd(af, w)
        if bias is not None:
            if bias.shape != (self.n,):
                raise ValueError(
                    f"{desc}: bias must have shape ({self.n},), got {bias.shape}"
                )
            y += bias.astype(_F32)
        return (y.astype(a.dtype, copy=False),)
