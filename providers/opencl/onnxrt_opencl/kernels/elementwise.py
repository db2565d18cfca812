"""Elementwise kernels: every op of :data:`onnxrt_opencl.codegen.OPS`, one node at a time.

Single nodes run through the same generated-code path as fused groups
(:class:`~onnxrt_opencl.codegen.ElementwiseProgram`), so a chain and its nodes compute
alike. A node is refused (and runs on the CPU) when a dtype is unknown or outside what
the op supports here, or an attribute asks for something the kernel does not do.
"""

from __future__ import annotations


from ..codegen import OPS, ElementwiseProgram, EwNode
from ..registry import op
from .base import CLKernel

__all__ = ["ElementwiseKernel", "elementwise_refusal", "EW_OPS"]

#: the op types the provider fuses
EW_OPS = frozenset(OPS)


def elementwise_refusal(ni) -> str | None:
    """``None`` when the elementwise path runs node ``ni``, else why it does not."""
    spec = OPS[ni.op_type]
    if ni.op_type in ("Add", "Sub", "Mul", "Div", "Pow", "And", "Or", "Xor", "Equal", "Less", "Greater") and (
        "broadcast" in ni.attrs or "axis" in ni.attrs
    ):
        return "legacy broadcast attributes run on the CPU"
    if ni.op_type == "Mod" and not int(ni.attrs.get("fmod", 0)) and any(
        ni.input_dtype(i) is not None and ni.input_dtype(i).kind == "f" for i in range(len(ni.inputs))
    ):
        return "Mod with fmod=0 on floats is not defined"
    if ni.op_type == "Gelu" and ni.attrs.get("approximate", "none") not in ("none", "tanh"):
        return f"Gelu approximate={ni.attrs.get('approximate')!r} is not supported"
    present = [i for i, n in enumerate(ni.inputs) if n]
    lo, hi = spec.arity
    if not lo <= len(ni.inputs) <= hi:
        return f"{len(ni.inputs)} inputs are not supported"
    dts = []
    for i in present:
        dt = ni.input_dtype(i)
        if dt is None:
            return f"input {i} has no static type"
        allowed = spec.types[min(i, len(spec.types) - 1)]
        if dt not in allowed:
            return f"input {i} has type {dt}, which {ni.op_type} does not take here"
        dts.append(dt)
    if spec.accepts is not None:
        why = spec.accepts(ni.attrs)
        if why:
            return why
    if ni.op_type in ("Min", "Max", "Sum", "Mean", "Where", "PRelu", "Clip") and len(set(
        dts[1:] if ni.op_type == "Where" else dts
    )) > 1:
        return "inputs of different types"
    if len([o for o in ni.outputs if o]) != 1:
        return "only single-output nodes"
    return None


class ElementwiseKernel(CLKernel):
    """One elementwise node, as a one-node generated kernel."""

    def setup(self) -> None:
        n = self.node
        self.names = [i for i in dict.fromkeys(i for i in n.inputs if i)]
        self.positions = [n.inputs.index(name) for name in self.names]

    def prepare(self) -> None:
        n = self.node
        ew = EwNode(n.op_type, list(n.inputs), list(n.outputs[:1]), dict(n.attrs), n.name)
        self.program = ElementwiseProgram([ew], self.names, [n.outputs[0]], self.rt)

    def run(self, *inputs):
        return self.program.run(*[inputs[p] for p in self.positions])


for _name in sorted(OPS):
    op(_name, since=1, accepts=elementwise_refusal)(ElementwiseKernel)

del _name
