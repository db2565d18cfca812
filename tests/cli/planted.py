"""A provider with one deliberately wrong kernel, for the ``compare`` tests.

Its Sigmoid adds 0.1. It claims the Sigmoid nodes named in ``targets`` (all of
them when ``targets`` is None), so a test can plant the error at one chosen node.
"""

import numpy as np

from onnxrt import hookimpl
from onnxrt.plugin.kernel import Kernel, KernelRegistry
from onnxrt.plugin.provider import Capability, ExecutionProvider


class WrongSigmoidProvider(ExecutionProvider):
    """Runs Sigmoid, wrongly: 1 / (1 + exp(-x)) + 0.1."""

    name = "WrongSigmoidExecutionProvider"
    aliases = ("wrong",)
    priority = 60
    targets: set | None = None

    @classmethod
    def build_registry(cls):
        reg = KernelRegistry()

        @reg.op("Sigmoid", since=1)
        class Sigmoid(Kernel):
            def run(self, x):
                return ((1 / (1 + np.exp(-x)) + 0.1).astype(x.dtype),)

        return reg

    def get_capability(self, graph, node_info):
        caps = super().get_capability(graph, node_info)
        if self.targets is None:
            return caps
        return [Capability(c.nodes) for c in caps if c.nodes[0].name in self.targets]


@hookimpl
def onnxrt_register_providers(registry):
    registry.add_provider(WrongSigmoidProvider)
