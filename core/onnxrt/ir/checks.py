"""Checks of control-flow nodes against their bodies, once the whole graph is built.

onnx's checker leaves most of these to the runtime, and a body that does not fit its
node otherwise runs and produces wrong or missing outputs: an ``If`` whose branches
return different numbers or types of values, a ``Loop`` body without its carried
outputs, a ``Scan`` body without its scan outputs, a ``Loop`` whose carried value
changes type. What the bodies declare is checked here; the control-flow kernels
check at run time what only shows there (types the bodies leave undeclared).
"""

from __future__ import annotations

from onnx import TypeProto

from ..errors import InvalidGraph
from .graph import Graph, Node

__all__ = ["check_control_flow"]


def check_control_flow(graph: Graph) -> None:
    """Check every ``If``, ``Loop`` and ``Scan`` node in ``graph`` and its subgraphs.

    :raises InvalidGraph: naming the node and what does not fit.
    """
    for _, node in graph.walk():
        if node.domain:
            continue
        if node.op_type == "If":
            _check_if(node)
        elif node.op_type == "Loop":
            _check_loop(node)
        elif node.op_type == "Scan" and node.opset >= 9:
            _check_scan(node)


def _elem(tp: TypeProto | None) -> str | None:
    """A comparable description of a declared type: the kind and element type where
    declared, None where the type says nothing to compare."""
    if tp is None:
        return None
    which = tp.WhichOneof("value")
    if which == "tensor_type":
        return f"tensor({tp.tensor_type.elem_type})" if tp.tensor_type.elem_type else None
    if which == "sequence_type":
        inner = _elem(tp.sequence_type.elem_type)
        return f"seq({inner})" if inner else "seq"
    if which == "optional_type":
        inner = _elem(tp.optional_type.elem_type)
        return f"optional({inner})" if inner else "optional"
    if which in ("map_type", "sparse_tensor_type"):
        return which
    return None


def _kind(desc: str | None) -> str | None:
    return None if desc is None else desc.split("(")[0]


def _differ(a: str | None, b: str | None) -> bool:
    """Whether two declared types conflict: different kinds, or both fully declared and unequal."""
    # an optional holds a value of its element type: optional(T) and T fit each other
    while a is not None and a.startswith("optional"):
        a = a[len("optional("):-1] if a.startswith("optional(") else None
    while b is not None and b.startswith("optional"):
        b = b[len("optional("):-1] if b.startswith("optional(") else None
    if a is None or b is None:
        return False
    if _kind(a) != _kind(b):
        return True
    if "(" in a and "(" in b:
        return a != b
    return False


def _show(desc: str | None) -> str:
    from onnx import TensorProto

    if desc is None:
        return "undeclared"
    if desc.startswith("tensor(") and desc[7:-1].isdigit():
        return f"tensor({TensorProto.DataType.Name(int(desc[7:-1])).lower()})"
    return desc


def _out_types(g: Graph) -> list[str | None]:
    return [_elem(vi.type) if vi.HasField("type") else None for vi in g.outputs]


def _in_types(g: Graph) -> list[str | None]:
    return [_elem(vi.type) if vi.HasField("type") else None for vi in g.inputs]


def _what(node: Node) -> str:
    return f"{node.op_type} node {node.name!r}"


def _check_if(node: Node) -> None:
    then_g, else_g = node.subgraphs.get("then_branch"), node.subgraphs.get("else_branch")
    if not isinstance(then_g, Graph) or not isinstance(else_g, Graph):
        raise InvalidGraph(f"{_what(node)} needs a then_branch and an else_branch graph")
    n_out = len(node.outputs)
    for label, g in (("then_branch", then_g), ("else_branch", else_g)):
        if len(g.outputs) != n_out:
            raise InvalidGraph(
                f"{_what(node)}: its {label} returns {len(g.outputs)} values, but the node has {n_out} outputs"
            )
    for i, (a, b) in enumerate(zip(_out_types(then_g), _out_types(else_g))):
        if _differ(a, b):
            raise InvalidGraph(
                f"{_what(node)}: output {i} is {_show(a)} from then_branch but {_show(b)} from else_branch"
            )


def _check_loop(node: Node) -> None:
    body = node.subgraphs.get("body")
    if not isinstance(body, Graph):
        raise InvalidGraph(f"{_what(node)} needs a body graph")
    n_carried = len(node.inputs) - 2
    if n_carried < 0:
        raise InvalidGraph(f"{_what(node)} needs its trip count and condition inputs (empty names where absent)")
    if len(body.inputs) != 2 + n_carried:
        raise InvalidGraph(
            f"{_what(node)}: its body takes {len(body.inputs)} inputs, but the node carries {n_carried} "
            f"values (the body takes the iteration number, the condition and each carried value: "
            f"{2 + n_carried})"
        )
    if len(body.outputs) < 1 + n_carried:
        raise InvalidGraph(
            f"{_what(node)}: its body returns {len(body.outputs)} values, fewer than the condition and "
            f"the {n_carried} carried values it must return"
        )
    n_scan = len(body.outputs) - 1 - n_carried
    if len(node.outputs) > n_carried + n_scan:
        raise InvalidGraph(
            f"{_what(node)} has {len(node.outputs)} outputs, but its body returns {n_carried} carried "
            f"values and {n_scan} scan outputs"
        )
    ins, outs = _in_types(body), _out_types(body)
    for j in range(n_carried):
        if _differ(ins[2 + j], outs[1 + j]):
            raise InvalidGraph(
                f"{_what(node)}: carried value {j} enters its body as {_show(ins[2 + j])} but leaves it as "
                f"{_show(outs[1 + j])}"
            )


def _check_scan(node: Node) -> None:
    body = node.subgraphs.get("body")
    if not isinstance(body, Graph):
        raise InvalidGraph(f"{_what(node)} needs a body graph")
    n_scan_in = node.attr("num_scan_inputs")
    if n_scan_in is None or not 0 < n_scan_in <= len(node.inputs):
        raise InvalidGraph(
            f"{_what(node)}: num_scan_inputs {n_scan_in} must be between 1 and its {len(node.inputs)} inputs"
        )
    n_state = len(node.inputs) - n_scan_in
    if len(body.inputs) != len(node.inputs):
        raise InvalidGraph(
            f"{_what(node)}: its body takes {len(body.inputs)} inputs, but the node passes it "
            f"{n_state} state values and {n_scan_in} scan slices"
        )
    if len(body.outputs) != len(node.outputs):
        raise InvalidGraph(
            f"{_what(node)} has {len(node.outputs)} outputs ({n_state} states and "
            f"{len(node.outputs) - n_state} scan outputs), but its body returns {len(body.outputs)} values"
        )
    if len(node.outputs) < n_state:
        raise InvalidGraph(f"{_what(node)} has {len(node.outputs)} outputs, fewer than its {n_state} states")
    ins, outs = _in_types(body), _out_types(body)
    for j in range(n_state):
        if _differ(ins[j], outs[j]):
            raise InvalidGraph(
                f"{_what(node)}: state {j} enters its body as {_show(ins[j])} but leaves it as {_show(outs[j])}"
            )
    for label, key, count in (("scan_input_axes", "scan_input_axes", n_scan_in),
                              ("scan_output_axes", "scan_output_axes", len(node.outputs) - n_state),
                              ("scan_input_directions", "scan_input_directions", n_scan_in),
                              ("scan_output_directions", "scan_output_directions", len(node.outputs) - n_state)):
        v = node.attr(key)
        if v is not None and len(v) != count:
            raise InvalidGraph(f"{_what(node)}: {label} has {len(v)} entries for {count} values")
