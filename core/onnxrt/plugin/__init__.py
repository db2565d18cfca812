"""Everything a provider author needs, in one namespace.

A provider package defines an :class:`ExecutionProvider` subclass with a
:class:`KernelRegistry`, and registers it from a plugin module found through the
``onnxrt.providers`` entry-point group::

    from onnxrt.plugin import ExecutionProvider, KernelRegistry, hookimpl

    REGISTRY = KernelRegistry()

    @REGISTRY.op("Relu", since=14)
    def relu(k, x):
        return k.xp.maximum(x, 0)

    class AcmeExecutionProvider(ExecutionProvider):
        name = "AcmeExecutionProvider"
        aliases = ("acme",)

        @classmethod
        def build_registry(cls):
            return REGISTRY

    @hookimpl
    def onnxrt_register_providers(registry):
        registry.add_provider(AcmeExecutionProvider)

What is here: the contract (:mod:`.provider`: providers, devices, capabilities;
:mod:`.kernel`: kernels and their registry), the hooks (:mod:`.hookspecs`), the geometry
helpers the providers share (:mod:`.pool_geometry` for pooling and transposed
convolution windows, :mod:`.resize_geometry` for Resize's coordinate tables), and the
allocation cap kernels must consult before allocating by a computed size
(:func:`check_allocation`). :mod:`.discovery` is the core's side: it finds and
registers the installed providers.
"""

from ..run.limits import check_allocation, checked_size
from .discovery import register_plugin, unregister_plugin
from .hookspecs import hookimpl, hookspec
from .kernel import (DirectCall, FunctionKernel, Kernel, KernelDef, KernelRegistry, NodeInfo, NoKernelError,
                     decode_attribute)
from .provider import Capability, Device, ExecutionProvider, HostDevice, flag_option, group_io, selector_option, size_option

__all__ = [
    "ExecutionProvider",
    "Device",
    "HostDevice",
    "Capability",
    "group_io",
    "flag_option",
    "size_option",
    "selector_option",
    "Kernel",
    "FunctionKernel",
    "DirectCall",
    "KernelDef",
    "KernelRegistry",
    "NodeInfo",
    "NoKernelError",
    "decode_attribute",
    "hookimpl",
    "hookspec",
    "check_allocation",
    "checked_size",
    "register_plugin",
    "unregister_plugin",
]
