"""The in-memory graph: nodes joined by value names, cheap to rewrite.

Edges are value names, as in ONNX itself, so a transform rewrites a node's
``inputs``/``outputs`` lists and nothing else has to be kept in sync. Producers and
consumers are derived on demand. Subgraphs (If/Loop/Scan bodies) are nested
:class:`Graph` objects whose ``parent`` is the enclosing graph, so names they read
from the outer scope resolve there. :meth:`Graph.to_proto` serializes back.
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np
import onnx
from onnx import AttributeProto, GraphProto, TensorProto, TypeProto, ValueInfoProto, helper, numpy_helper

from ..errors import InvalidArgument, InvalidGraph, NotImplemented
from ..run.limits import check_allocation
from .order import topological_order

__all__ = ["Node", "Graph", "MAX_NESTING", "tensor_to_array", "check_tensor_data"]

#: Subgraphs nested deeper than this are refused with InvalidGraph (not RecursionError).
MAX_NESTING = 24


def tensor_to_array(t: TensorProto, where: str = "") -> np.ndarray:
    """Decode a ``TensorProto`` to numpy, checking its data against its shape first.

    The declared size is checked against the allocation limit before anything is
    decoded, and the data (``raw_data`` or the typed field) must hold exactly what the
    shape needs: not fewer bytes or values, and not more.
    """
    check_tensor_data(t, where)
    try:
        return numpy_helper.to_array(t)
    except Exception as e:
        raise InvalidGraph(f"tensor {t.name or where!r} cannot be decoded: {e}") from None


def check_tensor_data(t: TensorProto, where: str = "") -> None:
    """Check a ``TensorProto``'s type, size and data count without decoding it."""
    label = repr(t.name or where or "<unnamed>")
    n = 1
    for d in t.dims:
        if d < 0:
            raise InvalidGraph(f"tensor {label} has a negative dimension {list(t.dims)}")
        n *= d
    if t.data_type == TensorProto.UNDEFINED:
        raise InvalidGraph(f"tensor {label} has no data type")
    try:
        dtype = helper.tensor_dtype_to_np_dtype(t.data_type)
        field_name = helper.tensor_dtype_to_field(t.data_type)
    except Exception:
        raise InvalidGraph(f"tensor {label} has unknown data type {t.data_type}") from None
    if t.HasField("segment"):
        raise NotImplemented(f"tensor {label} is split into segments, which onnxrt does not read")
    if t.data_location == TensorProto.EXTERNAL:
        raise InvalidGraph(f"tensor {label} refers to external data that was not loaded")
    try:
        check_allocation(t.dims, dtype, f"tensor {label}")
    except InvalidArgument as e:
        raise InvalidGraph(str(e)) from None
    if t.data_type == TensorProto.STRING:
        got, unit = len(t.string_data), "string_data holds {} strings"
        need = n
    elif t.HasField("raw_data"):
        bits = _SUB_BYTE_BITS.get(t.data_type)
        need = (n * bits + 7) // 8 if bits else n * dtype.itemsize
        got, unit = len(t.raw_data), "raw_data holds {} bytes"
    else:
        got, unit = len(getattr(t, field_name)), field_name + " holds {} values"
        if t.data_type in (TensorProto.COMPLEX64, TensorProto.COMPLEX128):
            need = 2 * n
        elif _SUB_BYTE_BITS.get(t.data_type) in (2, 4):
            per = 8 // _SUB_BYTE_BITS[t.data_type]
            need = (n + per - 1) // per
        else:
            need = n
    if got != need:
        raise InvalidGraph(f"tensor {label}: {unit.format(got)}, but its shape {list(t.dims)} needs {need}")


_SUB_BYTE_BITS = {
    getattr(TensorProto, k): b
    for k, b in (("UINT4", 4), ("INT4", 4), ("FLOAT4E2M1", 4), ("UINT2", 2), ("INT2", 2),
                 ("FLOAT6E2M3", 6), ("FLOAT6E3M2", 6))
    if hasattr(TensorProto, k)
}


@dataclass(eq=False)
class Node:
    """One operator application.

    :ivar attrs: non-graph attributes as ``AttributeProto`` (kept raw for serialization).
    :ivar subgraphs: graph attributes as nested :class:`Graph` (a list for GRAPHS).
    :ivar opset: the version of ``domain`` this node is resolved against.
    :ivar provider: the execution provider assigned by the partitioner.
    """

    op_type: str
    domain: str = ""
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    name: str = ""
    attrs: dict[str, AttributeProto] = field(default_factory=dict)
    subgraphs: dict[str, "Graph | list[Graph]"] = field(default_factory=dict)
    opset: int = 1
    doc_string: str = ""
    provider: str | None = None

    def attr(self, name: str, default=None):
        """A decoded non-graph attribute value, or ``default``."""
        a = self.attrs.get(name)
        if a is None:
            return default
        v = helper.get_attribute_value(a)
        if isinstance(v, bytes):
            return v.decode("utf-8", "replace")
        return v

    def all_subgraphs(self) -> Iterator["Graph"]:
        """Every subgraph attribute of this node (not recursive)."""
        for g in self.subgraphs.values():
            if isinstance(g, list):
                yield from g
            else:
                yield g

    def implicit_inputs(self) -> list[str]:
        """Outer-scope names read by this node's subgraphs (recursively)."""
        seen: dict[str, None] = {}
        for g in self.all_subgraphs():
            for n in g.free_names():
                seen[n] = None
        return list(seen)

    def to_proto(self, hollow_above: int | None = None) -> onnx.NodeProto:
        """Serialize back to a ``NodeProto``.

        :param hollow_above: write the large tensors (a ``Constant``'s ``value``, its
            subgraphs' initializers) of more elements than this, except integer ones,
            with their name, type and shape but no data: for shape inference, which
            reads nothing else of them (:func:`~onnxrt.ir.proto_edits.hollow`).
        """
        attrs = list(self.attrs.values())
        if hollow_above is not None and self.op_type == "Constant" and "value" in self.attrs:
            attrs = [_hollow_attribute(a, hollow_above) if k == "value" else a for k, a in self.attrs.items()]
        for k, g in self.subgraphs.items():
            if isinstance(g, list):
                attrs.append(helper.make_attribute(k, [x.to_proto(hollow_above) for x in g]))
            else:
                a = AttributeProto(name=k, type=AttributeProto.GRAPH)
                a.g.CopyFrom(g.to_proto(hollow_above))
                attrs.append(a)
        n = onnx.NodeProto(op_type=self.op_type, domain=self.domain, name=self.name)
        n.input.extend(self.inputs)
        n.output.extend(self.outputs)
        n.attribute.extend(attrs)
        if self.doc_string:
            n.doc_string = self.doc_string
        return n

    def __repr__(self) -> str:
        return f"Node({self.op_type} {self.name!r}: {self.inputs} -> {self.outputs})"


class Graph:
    """A graph: nodes, inputs, outputs, initializers and known value types."""

    def __init__(self, name: str = "", opsets: dict[str, int] | None = None, parent: "Graph | None" = None):
        self.name = name
        self.nodes: list[Node] = []
        self.inputs: list[ValueInfoProto] = []
        self.outputs: list[ValueInfoProto] = []
        self.initializers: dict[str, np.ndarray] = {}
        self.value_types: dict[str, TypeProto] = {}
        self.opsets: dict[str, int] = dict(opsets or {})
        self.parent = parent
        self.doc_string = ""
        self._name_counter = itertools.count()

    # -- construction -----------------------------------------------------------
    @classmethod
    def from_proto(
        cls,
        gp: GraphProto,
        opsets: dict[str, int],
        parent: "Graph | None" = None,
        depth: int = 0,
    ) -> "Graph":
        """Build a graph (and its subgraphs) from a ``GraphProto``, validating it."""
        if depth > MAX_NESTING:
            raise InvalidGraph(f"subgraphs are nested more than {MAX_NESTING} levels deep")
        g = cls(gp.name, opsets, parent)
        g.doc_string = gp.doc_string
        g.inputs = list(gp.input)
        g.outputs = list(gp.output)
        for vi in itertools.chain(gp.input, gp.output, gp.value_info):
            if vi.HasField("type"):
                _check_type(vi.type, vi.name)
            if vi.name and vi.HasField("type"):
                g.value_types[vi.name] = vi.type
        for t in gp.initializer:
            if not t.name:
                raise InvalidGraph("an initializer has no name")
            if t.name in g.initializers:
                raise InvalidGraph(f"initializer {t.name!r} is defined twice")
            g.initializers[t.name] = tensor_to_array(t)
            if t.name not in g.value_types:
                g.value_types[t.name] = helper.make_tensor_type_proto(t.data_type, list(t.dims))
        for st in gp.sparse_initializer:
            name = st.values.name
            g.initializers[name] = _sparse_to_dense(st)
            g.value_types.setdefault(
                name, helper.make_tensor_type_proto(st.values.data_type, list(st.dims))
            )
        used_names: set[str] = set()
        for i, np_ in enumerate(gp.node):
            dom = "" if np_.domain in ("", "ai.onnx") else np_.domain
            node = Node(
                op_type=np_.op_type,
                domain=dom,
                inputs=list(np_.input),
                outputs=list(np_.output),
                name=np_.name,
                opset=opsets.get(dom, 1),
                doc_string=np_.doc_string,
            )
            for a in np_.attribute:
                if a.name in node.attrs or a.name in node.subgraphs:
                    raise InvalidGraph(f"node {np_.name or np_.op_type!r} has attribute {a.name!r} twice")
                _check_attribute(a, np_.name or np_.op_type)
                if a.type == AttributeProto.GRAPH:
                    node.subgraphs[a.name] = cls.from_proto(a.g, opsets, g, depth + 1)
                elif a.type == AttributeProto.GRAPHS:
                    node.subgraphs[a.name] = [cls.from_proto(x, opsets, g, depth + 1) for x in a.graphs]
                else:
                    node.attrs[a.name] = a
            schema = _schema(node.op_type, dom, node.opset)
            if schema is not None:
                _check_against_schema(node, np_, schema)
            g.nodes.append(node)
            if node.name:
                used_names.add(node.name)
        # give every node a unique, non-empty name: errors and profiles name nodes
        seen: set[str] = set()
        for i, node in enumerate(g.nodes):
            if not node.name or node.name in seen:
                base = node.name or f"{node.op_type}_{i}"
                cand = base
                k = 0
                while cand in seen or (cand != node.name and cand in used_names):
                    k += 1
                    cand = f"{base}_{k}"
                node.name = cand
            seen.add(node.name)
        if depth == 0:
            # subgraphs are checked once every enclosing graph is complete, since
            # they may read outer values produced by nodes listed after them
            g.validate()
            for _, node in g.walk():
                for sg in node.all_subgraphs():
                    sg.validate()
            from .checks import check_control_flow  # a module of its own; it imports this one

            check_control_flow(g)
        return g

    def validate(self) -> None:
        """Check single assignment, defined inputs and acyclicity; sort topologically."""
        defined: set[str] = set()
        for vi in self.inputs:
            if vi.name in defined:
                raise InvalidGraph(f"graph {self.name!r}: input {vi.name!r} is listed twice")
            defined.add(vi.name)
        defined.update(self.initializers)
        for node in self.nodes:
            for o in node.outputs:
                if not o:
                    continue
                if o in defined:
                    raise InvalidGraph(
                        f"graph {self.name!r}: value {o!r} is defined more than once "
                        f"(again as an output of node {node.name!r})"
                    )
                defined.add(o)
        for vi in self.outputs:
            if vi.name not in defined and not self._outer_defines(vi.name):
                raise InvalidGraph(f"graph {self.name!r}: output {vi.name!r} is never produced")
        for node in self.nodes:
            for i in node.inputs:
                if i and i not in defined and not self._outer_defines(i):
                    raise InvalidGraph(
                        f"node {node.name!r} ({node.op_type}) reads {i!r}, which is not defined"
                    )
        self.topological_sort()

    def _outer_defines(self, name: str) -> bool:
        p = self.parent
        while p is not None:
            if name in p.defined_names():
                return True
            p = p.parent
        return False

    # -- queries ----------------------------------------------------------------
    def defined_names(self) -> set[str]:
        """Names defined in this graph: inputs, initializers and node outputs."""
        s = {vi.name for vi in self.inputs}
        s.update(self.initializers)
        for n in self.nodes:
            s.update(o for o in n.outputs if o)
        return s

    def free_names(self) -> list[str]:
        """Names this graph (or its subgraphs) reads but does not define: outer scope."""
        defined = self.defined_names()
        out: dict[str, None] = {}
        for n in self.nodes:
            for i in n.inputs:
                if i and i not in defined:
                    out[i] = None
            for sg in n.all_subgraphs():
                for i in sg.free_names():
                    if i not in defined:
                        out[i] = None
        for vi in self.outputs:
            if vi.name not in defined:
                out[vi.name] = None
        return list(out)

    def input_names(self) -> list[str]:
        """Names of the graph inputs, in order."""
        return [vi.name for vi in self.inputs]

    def output_names(self) -> list[str]:
        """Names of the graph outputs, in order."""
        return [vi.name for vi in self.outputs]

    def producers(self) -> dict[str, Node]:
        """Value name -> the node producing it."""
        return {o: n for n in self.nodes for o in n.outputs if o}

    def read_names(self) -> set[str]:
        """The names the graph's outputs and nodes read, the outer-scope reads of the
        nodes' subgraphs included: what removing a node or an initializer must keep."""
        used = set(self.output_names())
        for n in self.nodes:
            used.update(n.inputs)
            if n.subgraphs:
                used.update(n.implicit_inputs())
        return used

    def consumers(self) -> dict[str, list[Node]]:
        """Value name -> nodes reading it (directly, or from a subgraph)."""
        out: dict[str, list[Node]] = {}
        for n in self.nodes:
            for i in itertools.chain(n.inputs, n.implicit_inputs() if n.subgraphs else ()):
                if i:
                    lst = out.setdefault(i, [])
                    if not lst or lst[-1] is not n:
                        lst.append(n)
        return out

    def unique_name(self, base: str) -> str:
        """A value or node name not yet used in this graph or its ancestors."""
        taken = self.defined_names() | {n.name for n in self.nodes}
        while True:
            cand = f"{base}__{next(self._name_counter)}"
            if cand not in taken and not self._outer_defines(cand):
                return cand

    def topological_sort(self) -> None:
        """Order nodes so each comes after its producers; a cycle is InvalidGraph."""
        producer_idx: dict[str, int] = {}
        for idx, n in enumerate(self.nodes):
            for o in n.outputs:
                if o:
                    producer_idx[o] = idx
        deps: list[set[int]] = []
        for n in self.nodes:
            d = set()
            names = list(n.inputs)
            if n.subgraphs:
                names.extend(n.implicit_inputs())
            for i in names:
                j = producer_idx.get(i)
                if j is not None:
                    d.add(j)
            deps.append(d)
        if all(all(j < i for j in d) for i, d in enumerate(deps)):
            return
        order, stuck = topological_order(deps)
        if stuck:
            names = [self.nodes[i].name for i in stuck][:5]
            raise InvalidGraph(f"graph {self.name!r} has a cycle through nodes {names}")
        self.nodes = [self.nodes[i] for i in order]

    def walk(self) -> Iterator[tuple["Graph", Node]]:
        """Every (graph, node) pair in this graph and all nested subgraphs."""
        for n in self.nodes:
            yield self, n
            for sg in n.all_subgraphs():
                yield from sg.walk()

    # -- serialization --------------------------------------------------------------
    def to_proto(self, hollow_above: int | None = None) -> GraphProto:
        """Serialize back to a ``GraphProto`` (value_info keeps the known types).

        :param hollow_above: as :meth:`Node.to_proto`'s, for the initializers too.
        """
        gp = GraphProto(name=self.name, doc_string=self.doc_string)
        gp.node.extend(n.to_proto(hollow_above) for n in self.nodes)
        gp.input.extend(self.inputs)
        gp.output.extend(self.outputs)
        for name, arr in self.initializers.items():
            arr = np.asarray(arr)
            # numbers only (strings keep their data), and no INT32/INT64: inference
            # propagates the values of those
            numeric = arr.dtype.kind in "fcbu" or (arr.dtype.kind == "i" and arr.dtype.itemsize < 4)
            if hollow_above is not None and arr.size > hollow_above and numeric:
                gp.initializer.append(TensorProto(name=name, dims=arr.shape,
                                                  data_type=helper.np_dtype_to_tensor_dtype(arr.dtype)))
            else:
                gp.initializer.append(numpy_helper.from_array(arr, name))
        io = {vi.name for vi in itertools.chain(self.inputs, self.outputs)}
        live = set()
        for n in self.nodes:
            live.update(n.outputs)
        for name in sorted(live - io - set(self.initializers)):
            tp = self.value_types.get(name)
            if tp is not None:
                vi = ValueInfoProto(name=name)
                vi.type.CopyFrom(tp)
                gp.value_info.append(vi)
        return gp


def _hollow_attribute(a: AttributeProto, limit: int) -> AttributeProto:
    """A ``Constant``'s tensor attribute ``a`` without its data if it is large (see
    :meth:`Node.to_proto`); ``a`` itself otherwise."""
    t = a.t
    if (a.type != AttributeProto.TENSOR or t.data_type in (TensorProto.INT32, TensorProto.INT64)
            or math.prod(t.dims) <= limit):
        return a
    return helper.make_attribute(a.name, TensorProto(name=t.name, dims=t.dims, data_type=t.data_type))


_KNOWN_ELEM_TYPES = frozenset(TensorProto.DataType.values())


def _check_type(tp: TypeProto, name: str, depth: int = 0) -> None:
    """A declared type must use known element types (the field is a bare int32)."""
    if depth > MAX_NESTING:
        raise InvalidGraph(f"value {name!r}: its type is nested more than {MAX_NESTING} levels deep")
    which = tp.WhichOneof("value")
    if which in ("tensor_type", "sparse_tensor_type"):
        et = getattr(tp, which).elem_type
        if et not in _KNOWN_ELEM_TYPES:
            raise InvalidGraph(f"value {name!r} is declared with unknown element type {et}")
    elif which == "sequence_type":
        _check_type(tp.sequence_type.elem_type, name, depth + 1)
    elif which == "optional_type":
        _check_type(tp.optional_type.elem_type, name, depth + 1)
    elif which == "map_type":
        if tp.map_type.key_type not in _KNOWN_ELEM_TYPES:
            raise InvalidGraph(f"value {name!r} is declared with unknown map key type {tp.map_type.key_type}")
        _check_type(tp.map_type.value_type, name, depth + 1)


@functools.lru_cache(maxsize=None)
def _schema(op_type: str, domain: str, opset: int):
    """The ONNX schema a node resolves to, or None (unknown op, version or domain)."""
    try:
        return onnx.defs.get_schema(op_type, opset, domain)
    except Exception:  # noqa: BLE001 - onnx raises SchemaError; no schema means nothing to check
        return None


def _check_against_schema(node: Node, proto, schema) -> None:
    """What onnx's checker verifies: input/output counts and attribute names and types.

    Kernels, fusions and constant folding rely on a node's attributes having the
    schema's types, so a mismatch is refused here, once, rather than in each of them.
    """
    what = f"{node.op_type} node {node.name or proto.op_type!r} ({node.domain or 'ai.onnx'} opset {node.opset})"
    n_in, n_out = len(proto.input), len(proto.output)
    if not schema.min_input <= n_in <= schema.max_input:
        raise InvalidGraph(
            f"{what} has {n_in} inputs; {node.op_type}-{schema.since_version} takes "
            f"{schema.min_input} to {schema.max_input}"
        )
    if not schema.min_output <= n_out <= schema.max_output:
        raise InvalidGraph(
            f"{what} has {n_out} outputs; {node.op_type}-{schema.since_version} makes "
            f"{schema.min_output} to {schema.max_output}"
        )
    specs = schema.attributes
    for a in proto.attribute:
        spec = specs.get(a.name)
        if spec is None:
            known = ", ".join(sorted(specs)) or "none"
            raise InvalidGraph(
                f"{what} has attribute {a.name!r}, which {node.op_type}-{schema.since_version} "
                f"does not define (it has: {known})"
            )
        if a.ref_attr_name:
            continue
        want = int(getattr(spec.type, "value", spec.type))
        if a.type != want:
            raise InvalidGraph(
                f"{what}: attribute {a.name!r} is {AttributeProto.AttributeType.Name(a.type)}, but "
                f"{node.op_type}-{schema.since_version} expects {AttributeProto.AttributeType.Name(want)}"
            )
    given = {a.name for a in proto.attribute}
    for name, spec in specs.items():
        if spec.required and name not in given:
            raise InvalidGraph(f"{what} lacks its required attribute {name!r}")


_ATTRIBUTE_FIELDS = {
    AttributeProto.FLOAT: None, AttributeProto.INT: None, AttributeProto.STRING: None,
    AttributeProto.TENSOR: "t", AttributeProto.GRAPH: "g", AttributeProto.SPARSE_TENSOR: "sparse_tensor",
    AttributeProto.TYPE_PROTO: "tp", AttributeProto.FLOATS: None, AttributeProto.INTS: None,
    AttributeProto.STRINGS: None, AttributeProto.TENSORS: None, AttributeProto.GRAPHS: None,
    AttributeProto.SPARSE_TENSORS: None, AttributeProto.TYPE_PROTOS: None,
}


def _check_attribute(a: AttributeProto, node: str) -> None:
    """An attribute must have a known type, and its tensors must match their shapes."""
    if a.type == AttributeProto.UNDEFINED:
        raise InvalidGraph(f"node {node!r}: attribute {a.name!r} has no type")
    if a.type not in _ATTRIBUTE_FIELDS:
        raise InvalidGraph(f"node {node!r}: attribute {a.name!r} has unknown type {a.type}")
    if not a.name:
        raise InvalidGraph(f"node {node!r} has an attribute with no name")
    where = f"attribute {a.name!r} of node {node!r}"
    if a.type == AttributeProto.TENSOR:
        check_tensor_data(a.t, where)
    elif a.type == AttributeProto.TENSORS:
        for t in a.tensors:
            check_tensor_data(t, where)
    elif a.type == AttributeProto.SPARSE_TENSOR:
        _sparse_to_dense(a.sparse_tensor, where)
    elif a.type == AttributeProto.SPARSE_TENSORS:
        for st in a.sparse_tensors:
            _sparse_to_dense(st, where)


def _sparse_to_dense(st, where: str = "") -> np.ndarray:
    label = repr(st.values.name or where or "<unnamed>")
    values = tensor_to_array(st.values, where)
    indices = tensor_to_array(st.indices, where)
    dims = list(st.dims)
    if any(d < 0 for d in dims):
        raise InvalidGraph(f"sparse tensor {label} has a negative dimension {dims}")
    try:
        check_allocation(dims, values.dtype, f"sparse tensor {label}")
    except InvalidArgument as e:
        raise InvalidGraph(str(e)) from None
    if indices.dtype.kind not in "iu":
        raise InvalidGraph(f"sparse tensor {label}: indices must be integers, not {indices.dtype}")
    indices = indices.astype(np.int64)
    nnz = values.size
    total = math.prod(dims) if dims else 1
    if values.ndim != 1:
        raise InvalidGraph(f"sparse tensor {label}: values must be 1-D, not shape {list(values.shape)}")
    if indices.ndim == 1 and indices.shape[0] == nnz:
        flat = indices
    elif indices.ndim == 2 and indices.shape == (nnz, len(dims)):
        if nnz and ((indices < 0).any() or (indices >= np.asarray(dims, np.int64)).any()):
            raise InvalidGraph(f"sparse tensor {label} has an index outside its shape {dims}")
        flat = np.ravel_multi_index(tuple(indices.T), dims) if nnz else indices.reshape(-1)
    else:
        raise InvalidGraph(
            f"sparse tensor {label}: indices of shape {list(indices.shape)} do not fit {nnz} values "
            f"in a tensor of shape {dims}"
        )
    if flat.size and (flat.min() < 0 or flat.max() >= total):
        raise InvalidGraph(f"sparse tensor {label} has an index outside its shape {dims}")
    dense = np.zeros(total, dtype=values.dtype)
    dense[flat] = values
    return dense.reshape(dims)
