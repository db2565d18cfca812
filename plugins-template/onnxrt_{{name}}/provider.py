"""The {{Name}} execution provider.

A provider is a class: a name, aliases and a default priority; the options it accepts;
whether it can run here (:meth:`is_available`); its device; its kernels; and, if it
compiles, which node groups it fuses and how.
"""

from __future__ import annotations

from onnxrt.plugin import ExecutionProvider, flag_option

from . import fusion
from .device import {{Name}}Device
from .kernels import build_registry

__all__ = ["{{Name}}ExecutionProvider"]


class {{Name}}ExecutionProvider(ExecutionProvider):
    """Runs Add, Mul and Relu on the {{Name}} device; the CPU provider runs the rest."""

    name = "{{Name}}ExecutionProvider"
    aliases = ("{{name}}",)
    #: the default order when the user lists no providers: higher first (the CPU is 0)
    priority = 50
    #: option name -> converter; any other key is an error naming the known ones (options may
    #: arrive as strings: flag_option takes "true"/"1"/"on" and the like)
    option_types = {"device_id": int, "fuse_elementwise": flag_option}
    default_options = {"device_id": 0, "fuse_elementwise": False}

    @classmethod
    def is_available(cls) -> str | None:
        """``None`` when the provider can run here, else the reason it cannot.

        A real accelerator checks here that its driver library loads and that a device
        is present, and returns e.g. ``"libacme.so not found"``; onnxrt then lists the
        provider as unavailable with that reason. Keep it cheap: it is called often.
        """
        return None

    @classmethod
    def build_registry(cls):
        """The provider's own kernels (plugins may add more through ``onnxrt_register_kernels``)."""
        return build_registry()

    def create_device(self):
        """The device this session's values live on (``device_id`` picks one)."""
        return {{Name}}Device(self.options["device_id"])

    def get_capability(self, graph, node_info):
        """Which nodes this provider takes: one by one, or fused chains when asked to fuse."""
        if self.options["fuse_elementwise"]:
            return fusion.elementwise_groups(graph, node_info, self.kernel_registry())
        return super().get_capability(graph, node_info)

    def compile(self, capability, graph, node_info):
        """Turn one fused group into one kernel (called once per group, at session build)."""
        return fusion.compile_group(self, capability, graph, node_info)
