"""Sparse tensors: onnxruntime's ``SparseTensor`` and sparse values in models.

A :class:`SparseTensor` holds a dense shape, its non-zero values and their indices in
COO form (linear or 2-D indices) or CSR form (inner and outer indices). Its data views
are read-only, as onnxruntime's are.

onnxrt's kernels compute on dense arrays. A model's sparse values enter densified:
sparse initializers and sparse ``Constant`` values become dense tensors when the
model is read (:func:`densify_model`), a sparse graph input takes a ``SparseTensor``
feed (densified before the run), ``com.microsoft.SparseToDenseMatMul`` becomes the
``Gemm`` it computes, and a graph output declared sparse comes back as a COO
``SparseTensor`` of its non-zero values (:func:`to_sparse`): an explicitly stored
zero is not kept.
"""

from __future__ import annotations

import enum
from typing import Any

import numpy as np
import onnx
from onnx import ModelProto, numpy_helper

from .errors import EPFail, InvalidArgument, InvalidGraph

__all__ = ["OrtSparseFormat", "SparseTensor", "densify_feeds", "densify_model", "to_sparse"]


class OrtSparseFormat(enum.IntEnum):
    """The storage formats onnxruntime names."""

    ORT_SPARSE_UNDEFINED = 0
    ORT_SPARSE_COO = 1
    ORT_SPARSE_CSRC = 2
    ORT_SPARSE_BLOCK_SPARSE = 4


def _readonly(a: np.ndarray) -> np.ndarray:
    v = a.view()
    v.flags.writeable = False
    return v


class _CooView:
    def __init__(self, indices: np.ndarray):
        self._indices = indices

    def indices(self) -> np.ndarray:
        """The COO indices: linear (1-D) or one row of coordinates per value (2-D)."""
        return _readonly(self._indices)


class _CsrView:
    def __init__(self, inner: np.ndarray, outer: np.ndarray):
        self._inner, self._outer = inner, outer

    def inner(self) -> np.ndarray:
        """The column index of each value."""
        return _readonly(self._inner)

    def outer(self) -> np.ndarray:
        """Where each row's values start (rows + 1 entries)."""
        return _readonly(self._outer)


class SparseTensor:
    """A sparse tensor in COO or CSR format, on the host."""

    def __init__(self, fmt: OrtSparseFormat, dense_shape, values: np.ndarray, indices: tuple[np.ndarray, ...]):
        self._format = OrtSparseFormat(fmt)
        self._shape = [int(d) for d in dense_shape]
        self._values = values
        self._indices = indices

    @classmethod
    def sparse_coo_from_numpy(cls, dense_shape, values, coo_indices, ort_device=None) -> SparseTensor:
        """A COO tensor: ``coo_indices`` linear (one per value) or 2-D (``[nnz, 2]``), int64."""
        _check_host(ort_device)
        values = _values(values)
        idx = np.ascontiguousarray(coo_indices)
        if idx.dtype != np.int64:
            raise InvalidArgument(f"COO indices must be int64, not {idx.dtype}")
        nnz = values.shape[0]
        if not (idx.shape == (nnz,) or (idx.ndim == 2 and idx.shape == (nnz, 2))):
            raise InvalidArgument(f"COO indices of shape {list(idx.shape)} do not fit {nnz} values "
                                  f"(expected [{nnz}] or [{nnz}, 2])")
        return cls(OrtSparseFormat.ORT_SPARSE_COO, dense_shape, values, (idx,))

    @classmethod
    def sparse_csr_from_numpy(cls, dense_shape, values, inner_indices, outer_indices, ort_device=None) -> SparseTensor:
        """A CSR tensor of a 2-D shape: ``inner_indices`` per value, ``outer_indices`` rows + 1."""
        _check_host(ort_device)
        values = _values(values)
        inner = np.ascontiguousarray(inner_indices)
        outer = np.ascontiguousarray(outer_indices)
        if inner.dtype != np.int64 or outer.dtype != np.int64:
            raise InvalidArgument("CSR indices must be int64")
        shape = [int(d) for d in dense_shape]
        if len(shape) != 2:
            raise InvalidArgument(f"a CSR tensor is 2-D, not shape {shape}")
        if inner.shape != (values.shape[0],) or outer.shape != (shape[0] + 1,):
            raise InvalidArgument(f"CSR indices: inner must hold {values.shape[0]} entries and outer "
                                  f"{shape[0] + 1}; got {list(inner.shape)} and {list(outer.shape)}")
        return cls(OrtSparseFormat.ORT_SPARSE_CSRC, shape, values, (inner, outer))

    def format(self) -> OrtSparseFormat:
        """The storage format."""
        return self._format

    def dense_shape(self) -> list[int]:
        """The shape of the dense tensor it stands for."""
        return list(self._shape)

    def data_type(self) -> str:
        """onnxruntime's type string, e.g. ``sparse_tensor(float)``."""
        from .dtypes import onnx_elem_type, type_string

        dt = self._values.dtype
        if dt == object or dt.kind in "US":
            return "sparse_tensor(string)"
        return "sparse_" + type_string(onnx_elem_type(dt))

    def device_name(self) -> str:
        """Always ``cpu``: onnxrt keeps sparse tensors on the host."""
        return "cpu"

    def values(self) -> np.ndarray:
        """The stored values (read-only)."""
        return _readonly(self._values) if self._values.dtype != object else self._values.copy()

    def as_coo_view(self) -> _CooView:
        """The COO indices; a CSR tensor is an error."""
        if self._format != OrtSparseFormat.ORT_SPARSE_COO:
            raise InvalidArgument(f"this sparse tensor is {self._format.name}, not COO")
        return _CooView(self._indices[0])

    def as_csrc_view(self) -> _CsrView:
        """The CSR indices; a COO tensor is an error."""
        if self._format != OrtSparseFormat.ORT_SPARSE_CSRC:
            raise InvalidArgument(f"this sparse tensor is {self._format.name}, not CSR")
        return _CsrView(*self._indices)

    def as_blocksparse_view(self):
        """Block-sparse storage is not supported by onnxrt."""
        raise InvalidArgument("onnxrt has no block-sparse tensors")

    def to_cuda(self, ort_device=None) -> SparseTensor:
        """onnxrt keeps sparse tensors on the host: copying one to a GPU is an error."""
        raise EPFail("onnxrt keeps sparse tensors on the host; a SparseTensor cannot be copied to a CUDA device")

    def to_dense(self) -> np.ndarray:
        """The dense array (zeros where no value is stored)."""
        v = self._values
        out = np.zeros(self._shape, dtype=v.dtype) if v.dtype != object else np.full(self._shape, "", dtype=object)
        if self._format == OrtSparseFormat.ORT_SPARSE_COO:
            idx = self._indices[0]
            if idx.ndim == 1:
                out.reshape(-1)[idx] = v
            else:
                out[tuple(idx.T)] = v
        else:
            inner, outer = self._indices
            rows = np.repeat(np.arange(self._shape[0]), np.diff(outer))
            out[rows, inner] = v
        return out

    def __repr__(self) -> str:
        return f"SparseTensor({self._format.name}, {self.data_type()}, dense_shape={self._shape}, nnz={len(self._values)})"


def _check_host(device) -> None:
    if device is None:
        return
    name = getattr(device, "name", "cpu")
    kind = device.device_type() if hasattr(device, "device_type") else 0
    if kind != 0:
        raise InvalidArgument(f"onnxrt builds sparse tensors on the host only, not on {name!r}")


def _values(values) -> np.ndarray:
    v = np.asarray(values)
    if v.ndim != 1:
        raise InvalidArgument(f"sparse values must be 1-D, not shape {list(v.shape)}")
    return v.astype(object) if v.dtype.kind in "US" else np.ascontiguousarray(v)


def to_sparse(dense: np.ndarray) -> SparseTensor:
    """A COO tensor of ``dense``'s non-zero entries, with linear indices."""
    flat = np.asarray(dense).reshape(-1)
    idx = np.flatnonzero(flat != ("" if flat.dtype == object else 0)).astype(np.int64)
    return SparseTensor(OrtSparseFormat.ORT_SPARSE_COO, np.shape(dense), np.ascontiguousarray(flat[idx]), (idx,))


def densify_model(proto: ModelProto) -> tuple[ModelProto, set[str], set[str]]:
    """The model with its sparse values made dense, and the names of the graph inputs and
    outputs that were declared sparse (their feeds and results convert at the boundary).

    The model is returned unchanged (the same object) when it has nothing sparse.
    """
    g = proto.graph
    sparse_in = {vi.name for vi in g.input if vi.type.WhichOneof("value") == "sparse_tensor_type"}
    sparse_out = {vi.name for vi in g.output if vi.type.WhichOneof("value") == "sparse_tensor_type"}
    if not (sparse_in or sparse_out or any(_rewrites(n) for n in _all_nodes(g))):
        return proto, set(), set()
    out = ModelProto()
    out.CopyFrom(proto)
    default = next((o.version for o in out.opset_import if o.domain in ("", "ai.onnx")), None)
    if default is None and any(n.op_type == "SparseToDenseMatMul" for n in _all_nodes(out.graph)):
        out.opset_import.append(onnx.helper.make_opsetid("", 13))
        default = 13
    _densify_graph(out.graph, default or 13)
    return out, sparse_in, sparse_out


def _all_nodes(g):
    for n in g.node:
        yield n
        for a in n.attribute:
            if a.HasField("g"):
                yield from _all_nodes(a.g)
            for sg in a.graphs:
                yield from _all_nodes(sg)


def _rewrites(node) -> bool:
    return _sparse_const_attr(node) is not None or (
        node.op_type == "SparseToDenseMatMul" and node.domain == "com.microsoft")


def _densify_graph(g, default_opset: int) -> None:
    from .ir.graph import _sparse_to_dense

    for vi in list(g.input) + list(g.output) + list(g.value_info):
        if vi.type.WhichOneof("value") == "sparse_tensor_type":
            st = vi.type.sparse_tensor_type
            tt = onnx.TypeProto.Tensor()
            tt.elem_type = st.elem_type
            if st.HasField("shape"):
                tt.shape.CopyFrom(st.shape)
            vi.type.tensor_type.CopyFrom(tt)
    for node in g.node:
        for a in node.attribute:
            if a.HasField("g"):
                _densify_graph(a.g, default_opset)
            for sg in a.graphs:
                _densify_graph(sg, default_opset)
        attr = _sparse_const_attr(node)
        if attr is not None:
            dense = _sparse_to_dense(attr.sparse_tensor, f"Constant {node.name!r}")
            del node.attribute[:]
            node.attribute.append(onnx.helper.make_attribute("value", numpy_helper.from_array(dense)))
        elif node.op_type == "SparseToDenseMatMul" and node.domain == "com.microsoft":
            # Y = alpha * op(A) @ op(B): a MatMul, or a Gemm (C optional from opset 11) with
            # the same attributes when they say more
            keep = [a for a in node.attribute if a.name in ("alpha", "transA", "transB")]
            del node.attribute[:]
            node.domain = ""
            if not keep:
                node.op_type = "MatMul"
            elif default_opset >= 11:
                node.op_type = "Gemm"
                node.attribute.extend(keep)
            else:
                raise InvalidGraph(f"SparseToDenseMatMul {node.name!r} with alpha or transposes needs "
                                   f"ai.onnx opset 11 or newer beside it (the model imports {default_opset})")


def _sparse_const_attr(node) -> Any:
    if node.op_type != "Constant" or node.domain not in ("", "ai.onnx"):
        return None
    for a in node.attribute:
        if a.type == onnx.AttributeProto.SPARSE_TENSOR and a.name in ("value", "sparse_value"):
            return a
    return None


def densify_feeds(feeds: Any, sparse_inputs: set[str]) -> Any:
    """``feeds`` with the sparse inputs' ``SparseTensor`` values (bare or in an ``OrtValue``) made dense."""
    if not isinstance(feeds, dict):
        return feeds
    out = dict(feeds)
    for name in sparse_inputs:
        v = out.get(name)
        inner = getattr(v, "_value", None)
        if isinstance(inner, SparseTensor):
            v = inner
        if isinstance(v, SparseTensor):
            out[name] = v.to_dense()
        elif v is not None:
            raise InvalidArgument(f"input {name!r} is a sparse tensor: feed a SparseTensor "
                                  f"(or an OrtValue holding one), not a {type(v).__name__}")
    return out
