"""The module onnxrt loads through the entry point: it registers the provider.

Keep this module cheap to import and free of device work. If the device library is
missing, still register the class: its ``is_available()`` returns the reason, and
onnxrt lists the provider as unavailable instead of failing.

Two more hooks exist (see onnxrt's docs/plugins.md): ``onnxrt_register_kernels`` adds
kernels to a provider that already exists (custom ops for the CPU provider, say), and
``onnxrt_register_transformers`` adds graph rewrites with an optimization level.
"""

from onnxrt.plugin import hookimpl

from .provider import {{Name}}ExecutionProvider


@hookimpl
def onnxrt_register_providers(registry):
    """Add :class:`{{Name}}ExecutionProvider`."""
    registry.add_provider({{Name}}ExecutionProvider)
