"""Large weights read straight from a model file, without parsing them as protobuf.

Parsing a model file the usual way holds its bytes, the parsed message (which copies
every weight) and then the decoded arrays: a 435 MB BERT-base file peaked at 963 MB
while its session was created. Here the protobuf wire format of the file is walked
only as far as the main graph's initializers: each large tensor whose data is plain
little-endian ``raw_data`` of a numpy type is read from the file straight into its
array, and the rest of the model (nodes, small tensors, everything else) is
re-encoded without those initializers and parsed as usual: 475 MB for BERT-base.

Anything unexpected (a field repeated where it should not be, a length running past
the end, a type without a plain numpy layout) leaves that tensor, or the whole file,
to the ordinary path, which reports errors with their usual types.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np

from ..run.limits import check_allocation

__all__ = ["MIN_FILE_BYTES", "encode_varint", "split_large_weights"]

#: Files smaller than this are parsed whole: the saving would not pay for the walk.
#: From 1 MiB it does: the walk costs a few milliseconds (9 ms for a 12 MB YOLO file
#: with 61 weights taken, against 8 ms to parse it whole) where the peak loses the
#: file's bytes, up to the size of the file (NudeNet's 320n: 113 -> 102 MiB).
MIN_FILE_BYTES = 1 << 20

# TensorProto.DataType -> numpy type, for the types whose raw_data is the plain
# little-endian array (INT32/INT64 stay in the model for shape inference)
_PLAIN = {
    1: np.float32, 2: np.uint8, 3: np.int8, 4: np.uint16, 5: np.int16, 9: np.bool_,
    10: np.float16, 11: np.float64, 12: np.uint32, 13: np.uint64,
}
# field numbers
_MODEL_GRAPH = 7
_GRAPH_INITIALIZER = 5
_T_DIMS, _T_TYPE, _T_NAME, _T_RAW, _T_LOCATION = 1, 2, 8, 9, 14
_T_SEGMENT = 3

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5


class _Bad(Exception):
    """The bytes are not what this reader handles; the ordinary path takes over."""


def _varint(buf, pos: int, end: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        if pos >= end or shift > 63:
            raise _Bad("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def encode_varint(n: int) -> bytes:
    """``n`` (non-negative) as a protobuf varint."""
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


class _Reader:
    """Sequential and positioned reads of a file, each checked for length."""

    def __init__(self, f, size: int):
        self.f = f
        self.size = size

    def read_at(self, pos: int, n: int) -> bytes:
        if n < 0 or pos + n > self.size:
            raise _Bad("a field runs past the end of the file")
        self.f.seek(pos)
        data = self.f.read(n)
        if len(data) != n:
            raise _Bad("the file ended early")
        return data

    def header(self, pos: int, end: int) -> tuple[int, int, int, int, int | None]:
        """``(field, wire_type, value_start, value_end, varint)`` of the field at
        ``pos`` in a message ending at ``end``; ``varint`` is the value of a varint
        field (None for the others)."""
        head = self.read_at(pos, min(20, end - pos))
        tag, p = _varint(head, 0, len(head))
        field, wt = tag >> 3, tag & 7
        if field == 0:
            raise _Bad("field number 0")
        if wt == _VARINT:
            value, q = _varint(head, p, len(head))
            return field, wt, pos + p, pos + q, value
        if wt == _LEN:
            n, q = _varint(head, p, len(head))
            vs = pos + q
            ve = vs + n
        elif wt == _I64:
            vs, ve = pos + p, pos + p + 8
        elif wt == _I32:
            vs, ve = pos + p, pos + p + 4
        else:
            raise _Bad(f"wire type {wt}")
        if ve > end:
            raise _Bad("field runs past its message")
        return field, wt, vs, ve, None


def _tensor_plan(r: _Reader, vs: int, ve: int, min_elements: int):
    """``(name, dtype, dims, data_start, data_end)`` for the tensor message at
    ``[vs, ve)`` if it is to be read directly, or None to leave it in the model. The
    raw data is only located, never read here."""
    dims, dtype, name, raw = [], None, None, None
    pos = vs
    while pos < ve:
        field, wt, s, e, value = r.header(pos, ve)
        pos = e
        if field == _T_DIMS:
            if wt == _VARINT:
                dims.append(value)
            elif wt == _LEN:
                packed = r.read_at(s, e - s)
                p = 0
                while p < len(packed):
                    d, p = _varint(packed, p, len(packed))
                    dims.append(d)
            else:
                return None
        elif field == _T_TYPE and wt == _VARINT:
            if dtype is not None:
                return None
            dtype = value
        elif field == _T_NAME and wt == _LEN:
            if name is not None:
                return None
            name = r.read_at(s, e - s).decode("utf-8")
        elif field == _T_RAW and wt == _LEN:
            if raw is not None:
                return None
            raw = (s, e)
        elif field in (_T_LOCATION, _T_SEGMENT) or field in (4, 5, 6, 7, 10, 11, 13):
            # external data, segments or typed data fields: the ordinary path
            return None
    if dtype not in _PLAIN or name is None or raw is None:
        return None
    dims = [int(d) for d in dims]
    count = math.prod(dims)
    np_type = np.dtype(_PLAIN[dtype])
    if count <= min_elements or raw[1] - raw[0] != count * np_type.itemsize:
        return None
    return name, np_type, dims, raw[0], raw[1]


def split_large_weights(path: Path, min_elements: int) -> tuple[bytes, dict[str, np.ndarray]] | None:
    """Read the main graph's large plain-``raw_data`` initializers of the model file
    ``path`` into arrays.

    Returns ``(model_bytes, weights)``: the model re-encoded without those
    initializers, and the arrays by name. Returns None where this reader does not
    apply (small file, big-endian machine, nothing to take, or bytes it does not
    recognize): then parse the file as usual. The file is read with ordinary reads,
    straight into each array, and never mapped: a file cut short while it is read
    makes this return None, where a mapping would fault.
    """
    size = path.stat().st_size
    if sys.byteorder != "little" or size < MIN_FILE_BYTES:
        return None
    try:
        with open(path, "rb") as f:
            return _split_file(_Reader(f, size), min_elements)
    except (_Bad, OSError, UnicodeDecodeError):
        return None


def _split_file(r: _Reader, min_elements: int):
    size = r.size
    head, tail, graph = [], [], None
    pos = 0
    while pos < size:
        field, wt, vs, ve, _ = r.header(pos, size)
        if field == _MODEL_GRAPH and wt == _LEN:
            if graph is not None:
                raise _Bad("more than one graph field")
            graph = (vs, ve)
        else:
            (head if graph is None else tail).append(r.read_at(pos, ve - pos))
        pos = ve
    if graph is None:
        raise _Bad("the model has no graph")
    kept, taken = [], []
    pos, g_end = graph
    while pos < g_end:
        field, wt, vs, ve, _ = r.header(pos, g_end)
        plan = None
        if field == _GRAPH_INITIALIZER and wt == _LEN:
            plan = _tensor_plan(r, vs, ve, min_elements)
        if plan is None:
            kept.append(r.read_at(pos, ve - pos))
        else:
            taken.append(plan)
        pos = ve
    if not taken:
        return None
    names = [t[0] for t in taken]
    if len(set(names)) != len(names):
        raise _Bad("an initializer is defined twice")  # the ordinary path says so
    weights = {}
    for name, dtype, dims, start, end in taken:
        check_allocation(dims, dtype, f"initializer {name!r}")
        arr = np.empty(dims, dtype=dtype)
        r.f.seek(start)
        if r.f.readinto(memoryview(arr.reshape(-1).view(np.uint8))) != end - start:
            raise _Bad("the file ended early")
        weights[name] = arr
    body = b"".join(kept)
    model = (b"".join(head) + encode_varint((_MODEL_GRAPH << 3) | _LEN) + encode_varint(len(body)) + body
             + b"".join(tail))
    return model, weights
