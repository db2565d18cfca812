"""Expanding ``ai.onnx.preview.training.Gradient`` into backward nodes (reverse-mode autodiff).

``Gradient(xs, zs, y)`` outputs d(sum of y)/dx for each name in ``xs``. It cannot be a
kernel, since it needs the forward nodes between ``xs`` and ``y``, so this graph rewrite
replaces it by ordinary ``ai.onnx`` nodes before partitioning:

* the forward nodes on paths from ``xs`` to ``y`` are found (names in ``xs``/``zs`` are
  leaves: the walk back from ``y`` stops there, so an intermediate value in ``xs`` is
  differentiated as if it were an input);
* the gradient of ``y`` is seeded with ones shaped like ``y`` and pushed backwards through
  each forward node, in reverse topological order, by a vector-Jacobian-product rule;
  a value read by several nodes sums the contributions;
* where an elementwise op broadcast an input, its gradient is summed over the broadcast
  axes and reshaped back (decided from the inferred shapes when they settle it, else
  computed at run time from ``Shape`` nodes).

When the Gradient node's inputs are not the very tensors named in ``xs``/``zs`` (the
spec allows evaluating the derivative at other values), the forward nodes depending on
them are cloned with those inputs substituted, and the clones are differentiated.

Only standard ``ai.onnx`` ops are emitted, at the opset the model imports, so the
result runs on whatever provider takes those ops. A forward op with no rule raises
:class:`onnxrt.errors.NotImplemented`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from onnx import TensorProto, helper, numpy_helper
from onnxrt.errors import InvalidGraph
from onnxrt.errors import NotImplemented as OrtNotImplemented
from onnxrt.ir import Graph, Node

from .gradient_rules import RULES

__all__ = ["GRADIENT_DOMAIN", "expand_gradient", "supported_ops"]

#: The domain of the Gradient op.
GRADIENT_DOMAIN = "ai.onnx.preview.training"

# element types numpy can hold directly; other float types get their constants by Cast
_NP_TYPES = {TensorProto.FLOAT16: np.float16, TensorProto.FLOAT: np.float32, TensorProto.DOUBLE: np.float64}


def expand_gradient(graph: Graph, ctx) -> bool:
    """Replace each Gradient node by the nodes computing its derivatives; True if any changed.

    All Gradient nodes of the main graph are expanded in one call (the transform driver
    runs a bounded number of rounds). A Gradient whose ``y`` depends on another
    Gradient's output (higher-order derivatives) waits until that one is expanded, so
    it differentiates the other's backward nodes.
    """
    changed = False
    while True:
        pending = [n for n in graph.nodes if _is_gradient(n)]
        if not pending:
            return changed
        producers = graph.producers()
        ready = None
        for node in pending:
            xs, zs, y = _gradient_attrs(node)
            anc, _ = _ancestors([y], set(xs) | set(zs), producers)
            if node in anc.values():
                raise InvalidGraph(f"Gradient node {node.name!r}: y {y!r} depends on the node's own outputs")
            if not any(_is_gradient(n) for n in anc.values()):
                ready = node
                break
        if ready is None:  # every pending Gradient waits on another: a cycle among them
            raise InvalidGraph(
                "Gradient nodes " + ", ".join(repr(n.name) for n in pending) + " depend on each other's outputs"
            )
        _Expansion(graph, ready, producers).run()
        changed = True


def supported_ops() -> list[str]:
    """The forward op types Gradient can differentiate through (``ai.onnx`` domain)."""
    return sorted(RULES)


def _is_gradient(node: Node) -> bool:
    return node.op_type == "Gradient" and node.domain == GRADIENT_DOMAIN


def _strings(node: Node, name: str) -> list[str]:
    a = node.attrs.get(name)
    if a is None:
        return []
    return [s.decode("utf-8") if isinstance(s, bytes) else str(s) for s in helper.get_attribute_value(a)]


def _gradient_attrs(node: Node) -> tuple[list[str], list[str], str]:
    xs = _strings(node, "xs")
    zs = _strings(node, "zs")
    y = node.attr("y")
    if not xs or not y:
        raise InvalidGraph(f"Gradient node {node.name!r} needs the attributes 'xs' and 'y'")
    return xs, zs, y


def _ancestors(roots: list[str], leaves: set[str], producers: dict[str, Node]) -> tuple[dict[int, Node], set[str]]:
    """Nodes (by id) and values ``roots`` are computed from, not looking past ``leaves``."""
    nodes: dict[int, Node] = {}
    seen: set[str] = set()
    stack = list(roots)
    while stack:
        v = stack.pop()
        if not v or v in seen:
            continue
        seen.add(v)
        if v in leaves:
            continue
        p = producers.get(v)
        if p is None or id(p) in nodes:
            continue
        nodes[id(p)] = p
        stack.extend(p.inputs)
        if p.subgraphs:
            stack.extend(p.implicit_inputs())
    return nodes, seen


def _static_shape(tp) -> list | None:
    """Dims of a TypeProto as int (known), str (symbolic) or None; None when the rank is unknown."""
    if tp is None or tp.WhichOneof("value") != "tensor_type" or not tp.tensor_type.HasField("shape"):
        return None
    out: list = []
    for d in tp.tensor_type.shape.dim:
        if d.HasField("dim_value"):
            out.append(int(d.dim_value))
        elif d.HasField("dim_param") and d.dim_param:
            out.append(d.dim_param)
        else:
            out.append(None)
    return out


def _reduce_axes(gshape: list | None, xshape: list | None) -> list[int] | None:
    """Axes of ``gshape`` to sum to undo broadcasting ``xshape`` to it, or None if unknown statically."""
    if gshape is None or xshape is None or len(xshape) > len(gshape):
        return None
    lead = len(gshape) - len(xshape)
    padded = [1] * lead + list(xshape)
    axes = []
    for i, (p, q) in enumerate(zip(padded, gshape)):
        if i < lead:
            axes.append(i)
        elif p is not None and p == q:
            continue
        elif p == 1 and isinstance(q, int):
            axes.append(i)
        else:  # a symbolic or unknown dim may or may not be 1 at run time
            return None
    return axes


class _Expansion:
    """Expands one Gradient node: clones (if needed), differentiates, wires the outputs."""

    def __init__(self, graph: Graph, node: Node, producers: dict[str, Node]):
        self.graph = graph
        self.node = node
        self.producers = producers
        self.opset = graph.opsets.get("", graph.opsets.get("ai.onnx", 18))
        self.new_nodes: list[Node] = []
        self.taken = graph.defined_names() | {n.name for n in graph.nodes}
        self.taken.update(o for o in node.outputs if o)
        self.counter = 0
        # extra dtype/shape facts for values this expansion creates
        self.dtypes: dict[str, int] = {}
        self.shapes: dict[str, list | None] = {}
        self._scalars: dict[tuple, str] = {}
        self._shape_of: dict[str, str] = {}

    # -- facts about values ------------------------------------------------------------
    def dtype(self, v: str) -> int | None:
        """The element type of ``v`` if known."""
        if v in self.dtypes:
            return self.dtypes[v]
        arr = self.graph.initializers.get(v)
        if arr is not None:
            try:
                return helper.np_dtype_to_tensor_dtype(np.asarray(arr).dtype)
            except Exception:  # noqa: BLE001 - an exotic dtype is simply unknown
                return None
        tp = self.graph.value_types.get(v)
        if tp is not None and tp.WhichOneof("value") == "tensor_type" and tp.tensor_type.elem_type:
            return tp.tensor_type.elem_type
        return None

    def shape(self, v: str) -> list | None:
        """The static dims of ``v`` (see :func:`_static_shape`), None if the rank is unknown."""
        if v in self.shapes:
            return self.shapes[v]
        arr = self.graph.initializers.get(v)
        if arr is not None:
            return list(np.shape(arr))
        return _static_shape(self.graph.value_types.get(v))

    def rank(self, v: str, what: str) -> int:
        """The rank of ``v``; rules that need it (to build a permutation) refuse without it."""
        s = self.shape(v)
        if s is None:
            raise OrtNotImplemented(
                f"Gradient node {self.node.name!r}: the rank of {v!r} is unknown, and the gradient of {what} needs it"
            )
        return len(s)

    def constant_value(self, v: str) -> np.ndarray | None:
        """The value of ``v`` when it is an initializer (not a graph input) or a Constant's output."""
        if v in self.graph.initializers and v not in set(self.graph.input_names()):
            return np.asarray(self.graph.initializers[v])
        p = self.producers.get(v)
        if p is not None and p.op_type == "Constant" and p.domain == "" and "value" in p.attrs:
            return numpy_helper.to_array(p.attrs["value"].t)
        return None

    # -- emitting ----------------------------------------------------------------------
    def fresh(self, base: str) -> str:
        """A value or node name not used anywhere in the graph."""
        while True:
            self.counter += 1
            cand = f"{base}__grad{self.counter}"
            if cand not in self.taken:
                self.taken.add(cand)
                return cand

    def emit(self, op: str, inputs: list[str], n_out: int = 1, base: str | None = None, **attrs):
        """Add an ``ai.onnx`` node; returns its output name (a list when ``n_out`` > 1)."""
        outs = [self.fresh(base or op.lower()) for _ in range(n_out)]
        node = Node(
            op_type=op,
            domain="",
            inputs=list(inputs),
            outputs=outs,
            name=self.fresh(f"{self.node.name}/{op}"),
            attrs={k: helper.make_attribute(k, v) for k, v in attrs.items() if v is not None},
            opset=self.opset,
        )
        self.new_nodes.append(node)
        return outs[0] if n_out == 1 else outs

    def const(self, arr: np.ndarray, base: str = "const") -> str:
        """A new initializer holding ``arr``."""
        name = self.fresh(base)
        self.graph.initializers[name] = np.asarray(arr)
        return name

    def ints(self, values) -> str:
        """A 1-D int64 initializer."""
        key = ("ints", tuple(int(v) for v in values))
        if key not in self._scalars:
            self._scalars[key] = self.const(np.array(key[1], dtype=np.int64), "ints")
        return self._scalars[key]

    def scalar_like(self, ref: str, value: float) -> str:
        """A scalar ``value`` in the element type of ``ref``."""
        dt = self.dtype(ref)
        key = ("scalar", dt if dt is not None else ref, float(value))
        if key in self._scalars:
            return self._scalars[key]
        if dt in _NP_TYPES:
            out = self.const(np.array(value, dtype=_NP_TYPES[dt]), "scalar")
        elif dt is not None:
            out = self.emit("Cast", [self.const(np.array(value, dtype=np.float32), "scalar")], to=dt)
        else:
            out = self.cast_like(self.const(np.array(value, dtype=np.float32), "scalar"), ref)
        self._scalars[key] = out
        return out

    def cast_like(self, v: str, ref: str) -> str:
        """``v`` converted to the element type of ``ref``."""
        dt = self.dtype(ref)
        if dt is not None:
            return self.emit("Cast", [v], to=dt)
        if self.opset >= 15:
            return self.emit("CastLike", [v, ref])
        raise OrtNotImplemented(
            f"Gradient node {self.node.name!r}: the element type of {ref!r} is unknown "
            f"(shape inference gave none, and opset {self.opset} has no CastLike)"
        )

    def shape_of(self, v: str) -> str:
        """A ``Shape`` node's output for ``v`` (one per value)."""
        if v not in self._shape_of:
            self._shape_of[v] = self.emit("Shape", [v], base="shape")
        return self._shape_of[v]

    def reshape_to(self, v: str, like: str) -> str:
        """``v`` reshaped to the shape of ``like`` (a constant shape when it is known)."""
        s = self.shape(like)
        if s is not None and all(isinstance(d, int) for d in s):
            return self.emit("Reshape", [v, self.ints(s)])
        return self.emit("Reshape", [v, self.shape_of(like)])

    def reduce_sum(self, v: str, axes: list[int], keepdims: int = 1) -> str:
        """ReduceSum over constant ``axes`` (attribute before opset 13, input after)."""
        if self.opset >= 13:
            return self.emit("ReduceSum", [v, self.ints(axes)], keepdims=keepdims)
        return self.emit("ReduceSum", [v], axes=list(axes), keepdims=keepdims)

    def unsqueeze(self, v: str, axes: list[int]) -> str:
        """Unsqueeze at constant ``axes`` (attribute before opset 13, input after)."""
        if self.opset >= 13:
            return self.emit("Unsqueeze", [v, self.ints(axes)])
        return self.emit("Unsqueeze", [v], axes=list(axes))

    def transpose_last2(self, v: str, rank: int) -> str:
        """``v`` with its last two axes swapped."""
        perm = list(range(rank))
        perm[-2], perm[-1] = perm[-1], perm[-2]
        return self.emit("Transpose", [v], perm=perm)

    def expand_like(self, v: str, like: str) -> str:
        """``v`` broadcast to the run-time shape of ``like``."""
        return self.emit("Expand", [v, self.shape_of(like)])

    def unbroadcast(self, g: str, gshape: list | None, x: str) -> str:
        """Sum ``g`` (shaped ``gshape``) over the axes along which ``x`` was broadcast to it.

        Decided from static shapes when they settle it; otherwise the axes are found at run
        time: ``x``'s shape, left-padded with ones, is compared with ``g``'s and the
        mismatching positions summed (``ReduceSum`` with axes as an input, opset 13+).
        """
        xshape = self.shape(x)
        axes = _reduce_axes(gshape, xshape)
        if axes is not None:
            if not axes and len(gshape) == len(xshape):
                return g
            out = self.reduce_sum(g, axes, keepdims=1) if axes else g
            if len(gshape) != len(xshape):
                out = self.reshape_to(out, x)
            return out
        if self.opset < 13:
            raise OrtNotImplemented(
                f"Gradient node {self.node.name!r}: cannot tell statically whether {x!r} was broadcast, "
                f"and summing over run-time axes needs opset 13 or later (the model imports {self.opset})"
            )
        sx = self.shape_of(x)
        sg = self.emit("Shape", [g], base="shape")
        if gshape is not None and xshape is not None and len(gshape) >= len(xshape):
            lead = len(gshape) - len(xshape)
            padded = sx if lead == 0 else self.emit("Concat", [self.ints([1] * lead), sx], axis=0)
        else:
            diff = self.emit("Sub", [self.emit("Size", [sg]), self.emit("Size", [sx])])
            ones = self.emit(
                "ConstantOfShape",
                [self.emit("Reshape", [diff, self.ints([1])])],
                value=numpy_helper.from_array(np.array([1], dtype=np.int64)),
            )
            padded = self.emit("Concat", [ones, sx], axis=0)
        mask = self.emit("Not", [self.emit("Equal", [padded, sg])])
        axes_v = self.emit("Reshape", [self.emit("NonZero", [mask]), self.ints([-1])])
        red = self.emit("ReduceSum", [g, axes_v], keepdims=1, noop_with_empty_axes=1)
        return self.emit("Reshape", [red, sx])

    def add_all(self, values: list[str]) -> str:
        """The sum of gradient contributions."""
        if len(values) == 1:
            return values[0]
        if len(values) == 2:
            return self.emit("Add", values, base="grad_sum")
        return self.emit("Sum", values, base="grad_sum")

    # -- the expansion ----------------------------------------------------------------------
    def run(self) -> None:
        node = self.node
        xs, zs, y = _gradient_attrs(node)
        leaves = xs + zs
        if len(node.inputs) != len(leaves):
            raise InvalidGraph(
                f"Gradient node {node.name!r} has {len(node.inputs)} inputs; xs and zs name {len(leaves)}"
            )
        if len(node.outputs) > len(xs):
            raise InvalidGraph(f"Gradient node {node.name!r} has more outputs than names in xs")
        defined = self.taken
        for v in leaves + [y]:
            if v not in defined:
                raise InvalidGraph(f"Gradient node {node.name!r} names {v!r}, which the graph does not define")
        # the derivative is taken at the node's inputs; they usually are the xs/zs tensors
        eff = [inp or leaf for inp, leaf in zip(node.inputs, leaves)]
        sub = {leaf: e for leaf, e in zip(leaves, eff) if e != leaf}
        if sub:
            y = self._clone_forward(y, set(leaves), sub)
        xs_eff = eff[: len(xs)]
        self._differentiate(y, xs_eff, set(eff))
        self.graph.nodes = [n for n in self.graph.nodes if n is not node] + self.new_nodes
        self.graph.topological_sort()

    def _clone_forward(self, y: str, leaves: set[str], sub: dict[str, str]) -> str:
        """Copy the nodes between the substituted leaves and ``y``, reading the substitutes."""
        anc, _ = _ancestors([y], leaves, self.producers)
        same_shapes = all(self.shape(a) is not None and self.shape(a) == self.shape(b) for a, b in sub.items())
        rename = dict(sub)
        for n in self.graph.nodes:
            if id(n) not in anc or not any(i in rename for i in n.inputs + n.implicit_inputs()):
                continue
            if n.subgraphs:
                raise OrtNotImplemented(
                    f"Gradient node {self.node.name!r}: evaluating at other inputs would clone "
                    f"{n.op_type} node {n.name!r}, whose subgraphs cannot be cloned"
                )
            outs = []
            for o in n.outputs:
                if not o:
                    outs.append("")
                    continue
                new = self.fresh(o)
                rename[o] = new
                if self.dtype(o) is not None:
                    self.dtypes[new] = self.dtype(o)
                self.shapes[new] = self.shape(o) if same_shapes else None
                outs.append(new)
            clone = Node(
                op_type=n.op_type, domain=n.domain, inputs=[rename.get(i, i) for i in n.inputs],
                outputs=outs, name=self.fresh(n.name), attrs=dict(n.attrs), opset=n.opset,
            )
            self.new_nodes.append(clone)
            for o in outs:
                if o:
                    self.producers[o] = clone
        return rename.get(y, y)

    def _differentiate(self, y: str, xs: list[str], leaves: set[str]) -> None:
        wanted = {x for x, o in zip(xs, self.node.outputs) if o}
        anc, _ = _ancestors([y], leaves, self.producers)
        order = [n for n in self.graph.nodes + self.new_nodes if id(n) in anc]
        order = _topo(order)
        # forward pass: which values carry a derivative with respect to xs
        active: set[str] = set(wanted)
        steps: list[tuple[Node, list[bool], Callable]] = []
        for n in order:
            ins = [i in active for i in n.inputs]
            if n.subgraphs and any(i in active for i in n.implicit_inputs()):
                ins.append(True)
            if not any(ins):
                continue
            rule = RULES.get(n.op_type) if n.domain == "" else None
            if rule is None:
                dom = n.domain or "ai.onnx"
                raise OrtNotImplemented(
                    f"Gradient does not support op {n.op_type} (domain {dom!r}): node {n.name!r} lies "
                    f"between xs and y of Gradient node {self.node.name!r}, and it has no gradient rule"
                )
            diff, fn = rule
            need = [bool(a) and (diff is None or i in diff) for i, a in enumerate(ins[: len(n.inputs)])]
            if not any(need):
                continue
            steps.append((n, need, fn))
            active.update(o for o in n.outputs if o)
        # backward pass
        contrib: dict[str, list[str]] = {}
        if y in active:
            contrib[y] = [self.expand_like(self.scalar_like(y, 1.0), y)]

        def grad_of(v: str) -> str | None:
            lst = contrib.get(v)
            if not lst:
                return None
            if len(lst) > 1:
                contrib[v] = [self.add_all(lst)]
            return contrib[v][0]

        for n, need, fn in reversed(steps):
            gouts = [grad_of(o) if o else None for o in n.outputs]
            if all(g is None for g in gouts):
                continue
            grads = fn(self, n, gouts, need)
            for i, g in enumerate(grads):
                if g is not None and need[i]:
                    contrib.setdefault(n.inputs[i], []).append(g)
        for x, out in zip(xs, self.node.outputs):
            if not out:
                continue
            g = grad_of(x)
            if g is None:  # y does not depend on x
                g = self.expand_like(self.scalar_like(x, 0.0), x)
            self.new_nodes.append(
                Node("Identity", "", [g], [out], name=self.fresh(f"{self.node.name}/Identity"), opset=self.opset)
            )


def _topo(nodes: list[Node]) -> list[Node]:
    """``nodes`` ordered producers first (clones were appended after the originals)."""
    g = Graph()
    g.nodes = list(nodes)
    g.topological_sort()
    return g.nodes
