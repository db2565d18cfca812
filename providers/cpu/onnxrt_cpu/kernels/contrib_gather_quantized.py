"""com.microsoft GatherBlockQuantized: a Gather from a block-wise quantized table, as
language models with 2-, 4- or 8-bit (or float8/float4) embedding tables use it.

Only the gathered slices are dequantized, never the whole table: an embedding table
of 32,000 rows of 3,072 values would take 393 MB as float32.

Semantics follow onnxruntime's schema and CPU kernel (checked case by case in
tests/cpu/test_gather_block_quantized.py):

- ``data`` is int4 or uint4 (one value per element), uint8 (``bits`` 8, or 2 and 4
  packed along the last axis, lowest bits first; ``gather_axis`` 0), or a float8 or
  float4 type (symmetric: no zero point; ``block_size`` 0 makes the whole
  ``quantize_axis`` one block, and a scale dimension of 1 broadcasts).
- ``scales`` has ``data``'s rank, ``ceil(dim / block_size)`` entries along
  ``quantize_axis``; ``zero_points`` has the scales' shape and ``data``'s type (for
  packed uint8, packed along its last axis the same way). Without zero points the
  zero is 0, or ``2**(bits - 1)`` for uint8.
- An index in ``[-s, s)`` selects as in Gather; any other index gives zeros.
- ``output = (data - zero_point) * scale`` in the scales' type.
"""

from __future__ import annotations

import numpy as np
from onnxrt.plugin.kernel import Kernel

from ..registry import op
from .contrib_matmul_nbits import _unpack_bits

__all__ = ["GatherBlockQuantized"]

MS = "com.microsoft"
_F32 = np.dtype(np.float32)


def _kind(dtype: np.dtype) -> str:
    """``"int"`` (int4, uint4), ``"uint8"`` or ``"float"`` (float8, float4)."""
    name = dtype.name
    if name in ("int4", "uint4"):
        return "int"
    if dtype == np.uint8:
        return "uint8"
    if name.startswith("float8") or name.startswith("float4"):
        return "float"
    return ""


@op("GatherBlockQuantized", since=1, domain=MS)
class GatherBlockQuantized(Kernel):
    """Gather from a block-wise quantized ``data``, dequantizing the gathered slices;
    see the module docstring."""

    def setup(self):
        a = self.attrs
        self.bits = int(a.get("bits", 4))
        self.block = int(a.get("block_size", 128))
        self.gather_axis = int(a.get("gather_axis", 0))
        self.quantize_axis = int(a.get("quantize_axis", 1))
        self._name = self.node.describe()
        # a constant table in the usual layout (quantized along its last axis in whole
        # blocks, gathered along another), as language models ship their embeddings:
        # the values of each byte as float32 (one value a byte for int4/uint4, 8 // bits
        # for packed uint8) and the zero points and scales as float32, once, so that a
        # run is three gathers and two passes
        self._kept = None
        c = self.node.constants
        has_zp = len(self.node.inputs) > 3 and bool(self.node.inputs[3])
        if 0 in c and 2 in c and (3 in c or not has_zp):
            self._kept = self._keep(c[0], c[2], c.get(3))

    def _keep(self, data, scales, zp):
        """What :meth:`run` keeps for a constant table in the usual layout, or None."""
        kind = _kind(data.dtype)
        r = data.ndim
        if kind not in ("int", "uint8") or r < 2:
            return None
        ga, qa, size, bits = self.gather_axis % r, self.quantize_axis % r, self.block, self.bits
        if kind == "uint8" and (bits not in (2, 4, 8) or ga != 0):
            return None
        per = 8 // bits if kind == "uint8" else 1
        length = data.shape[-1] * per
        if qa != r - 1 or ga == qa or size < 16 or size & (size - 1) or length % size:
            return None
        blocks = length // size
        if scales.shape != data.shape[:-1] + (blocks,):
            return None
        byte = np.arange(256)
        if kind == "int":
            lut = _NIBBLES[data.dtype.name].reshape(256, 1)
        else:
            lut = ((byte[:, None] >> (np.arange(per) * bits)) & ((1 << bits) - 1)).astype(_F32)
        if zp is None:
            zero = np.float32(1 << (bits - 1)) if kind == "uint8" else None
        else:
            zb = -(-blocks * bits // 8) if kind == "uint8" else blocks
            if zp.dtype != data.dtype or zp.shape != data.shape[:-1] + (zb,):
                return None
            zero = lut[zp.view(np.uint8)].reshape(zp.shape[:-1] + (-1,))[..., :blocks, None]
            zero = np.ascontiguousarray(zero)
        sc = np.ascontiguousarray(scales.astype(_F32)[..., None])
        return (data, data.view(np.uint8), lut, zero, sc, scales.dtype, ga, blocks)

    def run(self, data, indices, scales, zero_points=None):
        kept = self._kept
        if kept is not None and data is kept[0] and indices.dtype in (np.int32, np.int64) and indices.size:
            codes, lut, zero, sc, dt, ga, blocks = kept[1:]
            s = codes.shape[ga]
            if 0 <= indices.min() and indices.max() < s:  # else the general path, which checks
                vals = lut[np.take(codes, indices, axis=ga)]  # [..., bytes, values a byte]
                vals = vals.reshape(vals.shape[:-2] + (blocks, -1))
                if zero is not None:
                    vals -= zero if zero.ndim == 0 else np.take(zero, indices, axis=ga)
                vals *= np.take(sc, indices, axis=ga)
                return (vals.reshape(vals.shape[:-2] + (-1,)).astype(dt, copy=False),)
        name = self._name
        kind = _kind(data.dtype)
        if not kind:
            raise TypeError(f"{name}: data must be int4, uint4, uint8 or a float8/float4 type, got {data.dtype}")
        if indices.dtype not in (np.int32, np.int64):
            raise TypeError(f"{name}: indices must be int32 or int64, got {indices.dtype}")
        r = data.ndim
        if r < 1 or scales.ndim != r:
            raise ValueError(f"{name}: scales {scales.shape} must have the rank of data {data.shape}")
        ga, qa = self.gather_axis, self.quantize_axis
        if not -r <= ga < r or not -r <= qa < r:
            raise ValueError(f"{name}: gather_axis {ga} and quantize_axis {qa} must lie in [{-r}, {r - 1}]")
        ga, qa = ga % r, qa % r
        bits, block = self.bits, self.block
        if kind == "float":
            if zero_points is not None:
                raise ValueError(f"{name}: a {data.dtype} table is symmetric and takes no zero_points")
            if block and (block < 16 or block & (block - 1)):
                raise ValueError(f"{name}: block_size must be 0 or a power of 2 >= 16, got {block}")
        elif block < 16 or block & (block - 1):
            raise ValueError(f"{name}: block_size must be a power of 2 >= 16, got {block}")
        packed = kind == "uint8" and bits < 8
        if kind == "uint8":
            if bits not in (2, 4, 8):
                raise ValueError(f"{name}: bits must be 2, 4 or 8 for uint8 data, got {bits}")
            if ga != 0:
                raise ValueError(f"{name}: gather_axis must be 0 for uint8 data, got {ga}")
            if packed and ga == r - 1:
                raise ValueError(f"{name}: packed uint8 data cannot be gathered along its packed last axis")

        shape = list(data.shape)
        if packed:
            shape[-1] *= 8 // bits
        length = shape[qa]
        size = block if block else length
        blocks = -(-length // size) if length else 0
        want = list(shape)
        want[qa] = blocks
        bad_scales = any(
            sd != wd and not (kind == "float" and sd == 1 and a != qa)
            for a, (sd, wd) in enumerate(zip(scales.shape, want))
        )
        if bad_scales:
            raise ValueError(f"{name}: scales {scales.shape} do not fit data {tuple(shape)} in blocks of {size}")
        if zero_points is not None:
            zp_shape = list(scales.shape)
            if packed:
                zp_shape[-1] = -(-zp_shape[-1] * bits // 8)
            if zero_points.dtype != data.dtype or list(zero_points.shape) != zp_shape:
                raise ValueError(
                    f"{name}: zero_points {zero_points.shape} {zero_points.dtype} must be "
                    f"{tuple(zp_shape)} {data.dtype}"
                )

        s = data.shape[ga]
        idx = indices.astype(np.int64, copy=False)
        valid = (idx >= -s) & (idx < s)
        idx = np.where(idx < 0, idx + s, idx)
        if not valid.all():
            idx = np.where(valid, idx, 0)
        if s == 0:
            idx = np.zeros_like(idx)  # all invalid: gather from an empty axis below
        if kind == "int" and qa == r - 1 and ga != qa and length % size == 0 and list(scales.shape) == want:
            y = _int4_rows(data, idx, scales, zero_points, ga, size)
            if not valid.all():
                y = np.where(valid.reshape((1,) * ga + idx.shape + (1,) * (r - ga - 1)), y, np.float32(0))
            return (y.astype(scales.dtype, copy=False),)
        # the gathered slices only, then their scales and zero points
        values = self._values(np.take(data, idx, axis=ga) if s else _empty_take(data, idx, ga), kind, packed)
        out_qa = qa if qa < ga else qa + idx.ndim - 1  # quantize_axis among the output's axes
        sc = self._per_value(scales, idx, ga, qa, size, length, out_qa, kind)
        y = values.astype(_F32)
        if zero_points is not None:
            zp = self._values(zero_points, kind, packed)
            if packed:
                zp = zp[..., : scales.shape[-1]]
            y -= self._per_value(zp, idx, ga, qa, size, length, out_qa, kind).astype(_F32)
        elif kind == "uint8":
            y -= np.float32(1 << (bits - 1))
        y *= sc.astype(_F32, copy=False)
        if not valid.all():
            mask = valid.reshape((1,) * ga + idx.shape + (1,) * (r - ga - 1))
            y = np.where(mask, y, np.float32(0))
        return (y.astype(scales.dtype, copy=False),)

    def _values(self, x, kind, packed):
        """The codes as numbers: packed uint8 split into its values; float8/float4 as is."""
        if packed:
            return _unpack_bits(x, self.bits)
        return x

    @staticmethod
    def _per_value(table, idx, ga, qa, size, length, out_qa, kind):
        """``table`` (scales or zero points, one entry per block along ``qa``) expanded
        to the output's shape: gathered as the data was, repeated ``size`` times along
        the quantize axis and cut to its length."""
        if ga == qa:
            return np.take(table, idx // size, axis=ga) if table.shape[ga] else _empty_take(table, idx, ga)
        if table.shape[ga] == 1 and kind == "float":
            picked = np.take(table, np.zeros_like(idx), axis=ga)  # one scale for every slice
        else:
            picked = np.take(table, idx, axis=ga) if table.shape[ga] else _empty_take(table, idx, ga)
        picked = np.repeat(picked, size, axis=out_qa)
        if picked.shape[out_qa] != length:
            picked = np.take(picked, np.arange(length), axis=out_qa)
        return picked


#: float32 value of each byte of an int4 / uint4 array (one value a byte, its low 4 bits)
_NIBBLES = {
    "int4": (((np.arange(256) & 15) ^ 8) - 8).astype(_F32),
    "uint4": (np.arange(256) & 15).astype(_F32),
}


def _int4_rows(data, idx, scales, zero_points, ga, size):
    """The usual layout, an int4/uint4 table quantized along its last axis in whole
    blocks and gathered along another: the gathered codes read as float32 through a
    table of the byte values (faster than the 4-bit type's own conversion), then one
    subtraction and one product per block broadcast over it."""
    lut = _NIBBLES[data.dtype.name]
    if data.shape[ga] == 0:
        return np.zeros(data.shape[:ga] + idx.shape + data.shape[ga + 1 :], _F32)
    vals = lut[np.take(data.view(np.uint8), idx, axis=ga)]
    blocks = vals.reshape(vals.shape[:-1] + (vals.shape[-1] // size, size))
    if zero_points is not None:
        blocks -= lut[np.take(zero_points.view(np.uint8), idx, axis=ga)][..., None]
    blocks *= np.take(scales, idx, axis=ga)[..., None]
    return vals


def _empty_take(x, idx, axis):
    """``np.take`` from an empty axis: zeros of the gathered shape (every index there
    is out of range, so the slices are zeroed anyway)."""
    return np.zeros(x.shape[:axis] + idx.shape + x.shape[axis + 1 :], x.dtype)
