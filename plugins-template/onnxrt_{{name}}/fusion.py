"""An example of a compiling (fusing) provider: chains of elementwise nodes become one kernel.

It is off by default; a session turns it on with the provider option
``fuse_elementwise``::

    providers=[("{{Name}}ExecutionProvider", {"fuse_elementwise": True}), "CPUExecutionProvider"]

How onnxrt drives a compiling provider:

1. ``get_capability(graph, node_info)`` returns :class:`onnxrt.Capability` objects. One
   with a single node means "run this node with its kernel"; one with several nodes (or
   a ``fused_name``) means "I will compile these nodes into one kernel".
2. After partitioning, onnxrt calls ``compile(capability, graph, node_info)`` once per
   fused group, when the session is built. It returns an object with a ``run`` method.
3. Each run calls ``kernel.run(*inputs)`` with the group's external inputs (values it
   reads but does not produce) in the order they are first read, and expects back the
   values used after the group (graph outputs, or inputs of later nodes) in the order the
   group's nodes produce them. :func:`onnxrt.plugin.group_io` computes both lists.

The group must be safe to run as one step: here it is a run of consecutive nodes in
topological order, each reading a value produced earlier in the run, so everything the
group reads already exists when its first node would have run.

A real compiler generates one device program here (OpenCL C, CUDA, a vendor graph) so
intermediates never leave registers. This template composes the per-node kernels, which
shows the plumbing and stays correct.
"""

from __future__ import annotations

from onnxrt.plugin import Capability, Kernel, NodeInfo, group_io

__all__ = ["elementwise_groups", "FusedChain"]

#: ops this example fuses (a real compiler lists what its code generator handles)
ELEMENTWISE = {("", "Add"), ("", "Mul"), ("", "Relu")}


def elementwise_groups(graph, node_info, registry) -> list[Capability]:
    """Capabilities for ``graph`` (a :class:`onnxrt.partition.GraphView`): chains of
    elementwise nodes, and single nodes otherwise."""
    caps: list[Capability] = []
    run: list = []
    produced: set[str] = set()

    def flush():
        if len(run) > 1:
            caps.append(Capability(list(run), fused_name=f"{{Name}}Fused_{run[0].name}"))
        elif run:
            caps.append(Capability(list(run)))
        run.clear()
        produced.clear()

    for node in graph.nodes:
        # the core offers this provider its candidates (nodes nobody took, and not the
        # shape computations it keeps on the CPU); the others break a chain
        takes = graph.is_candidate(node) and registry.find(node_info(node))[0] is not None
        if not takes:
            flush()
            continue
        fusable = (node.domain, node.op_type) in ELEMENTWISE
        if not fusable:
            flush()
            caps.append(Capability([node]))
            continue
        if run and not any(i in produced for i in node.inputs):
            flush()  # not connected to the chain: start a new one
        run.append(node)
        produced.update(o for o in node.outputs if o)
    flush()
    return caps


class FusedChain(Kernel):
    """One kernel for a fused group: runs the group's node kernels in order.

    Built once per group when the session is created; ``run`` keeps its intermediates
    in a local dict, so one kernel may serve many threads at once.
    """

    def __init__(self, name: str, steps, inputs: list[str], outputs: list[str]):
        super().__init__(NodeInfo(name=name, op_type="FusedGroup"))
        self.steps = steps  # [(kernel, input names, output names)]
        self.inputs = inputs
        self.outputs = outputs

    def run(self, *values):
        env = dict(zip(self.inputs, values))
        for kernel, ins, outs in self.steps:
            results = kernel.run(*[env[i] if i else None for i in ins])
            env.update((o, r) for o, r in zip(outs, results) if o)
        return tuple(env[o] for o in self.outputs)


def compile_group(provider, capability, graph, node_info) -> FusedChain:
    """Build the kernel for one fused group (what ``ExecutionProvider.compile`` returns)."""
    steps = [(provider.create_kernel(node_info(n)), list(n.inputs), list(n.outputs))
             for n in capability.nodes]
    inputs, outputs = group_io(graph, capability.nodes)
    return FusedChain(capability.fused_name or capability.nodes[0].name, steps, inputs, outputs)
