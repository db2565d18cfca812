"""LoRA adapters: onnxruntime's adapter files, ``LoraAdapter`` and ``AdapterFormat``.

An adapter file (``.onnx_adapter``) is onnxruntime's flatbuffer (file identifier
``TORT``): a format version, the adapter's and the model's versions, and named
parameters (dims, ONNX element type, raw little-endian bytes). ``AdapterFormat``
reads and writes it; ``LoraAdapter.Load`` reads it for a run: with
``RunOptions.add_active_adapter(adapter)`` each parameter feeds the model input of
the same name (a value given to ``run`` for that input wins).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from .dtypes import np_dtype, onnx_elem_type
from .errors import InvalidArgument, InvalidGraph, NoSuchFile

__all__ = ["AdapterFormat", "LoraAdapter", "FORMAT_VERSION", "adapter_feeds"]

FORMAT_VERSION = 1
_IDENT = b"TORT"
_STRING = 8  # TensorProto.STRING


def _read(path: str) -> tuple[int, int, dict[str, np.ndarray]]:
    # flatbuffers is read only here and in _write: a session that uses no adapter never loads it
    import flatbuffers
    from flatbuffers import number_types as N
    from flatbuffers.table import Table

    try:
        with open(path, "rb") as f:
            buf = bytearray(f.read())
    except FileNotFoundError:
        raise NoSuchFile(f"adapter file {path!r} does not exist") from None
    if len(buf) < 8 or bytes(buf[4:8]) != _IDENT:
        raise InvalidGraph(f"{path!r} is not an onnxruntime adapter file (no 'TORT' identifier)")
    try:
        root = Table(buf, flatbuffers.encode.Get(N.UOffsetTFlags.packer_type, buf, 0))

        def field(t: Table, slot: int, flags, default=0):
            o = t.Offset(4 + 2 * slot)
            return t.Get(flags, t.Pos + o) if o else default

        fmt = field(root, 0, N.Int32Flags)
        if fmt != FORMAT_VERSION:
            raise InvalidGraph(f"adapter file {path!r} has format version {fmt}; onnxrt reads {FORMAT_VERSION}")
        adapter_version = field(root, 1, N.Int32Flags)
        model_version = field(root, 2, N.Int32Flags)
        params: dict[str, np.ndarray] = {}
        po = root.Offset(10)
        for i in range(root.VectorLen(po) if po else 0):
            p = Table(buf, root.Indirect(root.Vector(po) + 4 * i))
            no = p.Offset(4)
            name = p.String(p.Pos + no).decode("utf-8") if no else ""
            do = p.Offset(6)
            dims = [p.Get(N.Int64Flags, p.Vector(do) + 8 * j) for j in range(p.VectorLen(do))] if do else []
            dtype = np_dtype(field(p, 2, N.Int32Flags))
            ro = p.Offset(10)
            raw = bytes(buf[p.Vector(ro):p.Vector(ro) + p.VectorLen(ro)]) if ro else b""
            arr = np.frombuffer(raw, dtype=dtype)
            if arr.size != int(np.prod(dims, dtype=np.int64)):
                raise InvalidGraph(f"adapter parameter {name!r}: {arr.size} values do not fill dims {dims}")
            params[name] = arr.reshape(dims).copy()
    except (IndexError, TypeError, ValueError, UnicodeDecodeError) as e:
        raise InvalidGraph(f"adapter file {path!r} is malformed: {e}") from None
    return adapter_version, model_version, params


def _write(path: str, adapter_version: int, model_version: int, params: dict[str, np.ndarray]) -> None:
    import flatbuffers

    b = flatbuffers.Builder(1024)
    offsets = []
    for name, a in params.items():
        a = np.ascontiguousarray(a)
        name_off = b.CreateString(name)
        b.StartVector(8, len(a.shape), 8)
        for d in reversed(a.shape):
            b.PrependInt64(int(d))
        dims_off = b.EndVector()
        raw = a.tobytes()
        b.StartVector(1, len(raw), 8)  # raw data aligned to 8, as onnxruntime writes it
        b.head = b.head - len(raw)
        b.Bytes[b.head:b.head + len(raw)] = raw
        raw_off = b.EndVector()
        b.StartObject(4)
        b.PrependUOffsetTRelativeSlot(0, name_off, 0)
        b.PrependUOffsetTRelativeSlot(1, dims_off, 0)
        b.PrependInt32Slot(2, onnx_elem_type(a.dtype), 0)
        b.PrependUOffsetTRelativeSlot(3, raw_off, 0)
        offsets.append(b.EndObject())
    b.StartVector(4, len(offsets), 4)
    for o in reversed(offsets):
        b.PrependUOffsetTRelative(o)
    params_off = b.EndVector()
    b.StartObject(4)
    b.PrependInt32Slot(0, FORMAT_VERSION, 0)
    b.PrependInt32Slot(1, int(adapter_version), 0)
    b.PrependInt32Slot(2, int(model_version), 0)
    b.PrependUOffsetTRelativeSlot(3, params_off, 0)
    b.Finish(b.EndObject(), file_identifier=_IDENT)
    with open(path, "wb") as f:
        f.write(b.Output())


def _host_array(value: Any, name: str) -> np.ndarray:
    from .ortvalue import OrtValue

    a = value.numpy() if isinstance(value, OrtValue) else np.asarray(value)
    if not isinstance(a, np.ndarray):
        raise InvalidArgument(f"adapter parameter {name!r} must be a tensor")
    if a.dtype == object or a.dtype.kind in "US":
        raise InvalidArgument(f"adapter parameter {name!r} is a STRING tensor; adapters hold numeric tensors only")
    return a


class AdapterFormat:
    """Build, read and write onnxruntime adapter files."""

    def __init__(self) -> None:
        self._adapter_version = 0
        self._model_version = 0
        self._params: dict[str, Any] = {}

    @classmethod
    def read_adapter(cls, file_path: str | os.PathLike) -> AdapterFormat:
        """Read an adapter file."""
        out = cls()
        out._adapter_version, out._model_version, params = _read(os.fspath(file_path))
        from .ortvalue import OrtValue

        out._params = {k: OrtValue(v) for k, v in params.items()}
        return out

    def export_adapter(self, file_path: str | os.PathLike) -> None:
        """Write the adapter file; string parameters are refused before anything is written."""
        arrays = {k: _host_array(v, k) for k, v in self._params.items()}
        _write(os.fspath(file_path), self._adapter_version, self._model_version, arrays)

    def get_format_version(self) -> int:
        """The file format's version (1)."""
        return FORMAT_VERSION

    def set_adapter_version(self, adapter_version: int) -> None:
        """The adapter's own version number."""
        self._adapter_version = int(adapter_version)

    def get_adapter_version(self) -> int:
        """The adapter's own version number."""
        return self._adapter_version

    def set_model_version(self, model_version: int) -> None:
        """The version of the model the adapter is for."""
        self._model_version = int(model_version)

    def get_model_version(self) -> int:
        """The version of the model the adapter is for."""
        return self._model_version

    def set_parameters(self, params: dict) -> None:
        """The parameters, name -> ``OrtValue`` (or array); replaces any earlier ones."""
        if not isinstance(params, dict):
            raise InvalidArgument(f"set_parameters expects a dict of name -> OrtValue, not {type(params).__name__}")
        self._params = dict(params)

    def get_parameters(self) -> dict:
        """The parameters, name -> ``OrtValue``."""
        return dict(self._params)


class LoraAdapter:
    """An adapter loaded for runs: ``adapter.Load(path)``, then ``RunOptions.add_active_adapter``."""

    def __init__(self) -> None:
        self._params: dict[str, np.ndarray] = {}
        self._path: str | None = None

    def Load(self, adapter_path: str | os.PathLike) -> None:  # noqa: N802 - onnxruntime's name
        """Read the adapter file's parameters."""
        _, _, self._params = _read(os.fspath(adapter_path))
        self._path = os.fspath(adapter_path)

    def parameters(self) -> dict[str, np.ndarray]:
        """The loaded parameters, name -> array."""
        return dict(self._params)

    def __repr__(self) -> str:
        return f"LoraAdapter({self._path!r}, {len(self._params)} parameters)"


def adapter_feeds(adapters: list[LoraAdapter], feeds: Any) -> Any:
    """``feeds`` with the active adapters' parameters added (a given feed wins; a later
    adapter's parameter replaces an earlier one's)."""
    if not isinstance(feeds, dict):
        return feeds
    extra: dict[str, np.ndarray] = {}
    for a in adapters:
        extra.update(a._params)
    return {**extra, **feeds}
