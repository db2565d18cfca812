"""The plugin author's manual: every hook onnxrt calls.

A plugin is a module (or object) with functions decorated by :data:`onnxrt.hookimpl`,
found through the ``onnxrt.providers`` entry-point group::

    [project.entry-points."onnxrt.providers"]
    acme = "onnxrt_acme.plugin"

Hooks are called while the plugin registry is being built or a session is being
created, never per node in the run loop. Every implementation of a hook is called
(none of them stops at the first result); they receive a registry object to add to
rather than returning loose values, so the order plugins load in never matters.
Priority is data: each provider's ``priority`` and the user's ``providers`` list.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:  # the registries import the contract, which imports nothing of these
    from ..optimizer import TransformerRegistry
    from .discovery import ProviderRegistry
    from .kernel import KernelRegistry

__all__ = ["hookspec", "hookimpl", "onnxrt_register_providers", "onnxrt_register_kernels",
           "onnxrt_register_transformers"]

hookspec = pluggy.HookspecMarker("onnxrt")
hookimpl = pluggy.HookimplMarker("onnxrt")


@hookspec
def onnxrt_register_providers(registry: ProviderRegistry) -> None:
    """Add execution provider classes.

    :param registry: a :class:`onnxrt.plugin.discovery.ProviderRegistry`; call
        ``registry.add_provider(cls)`` with each :class:`onnxrt.plugin.provider.ExecutionProvider`
        subclass the plugin defines. Two plugins adding the same provider name is an
        error that names both.
    :return: nothing; return values are ignored.

    Called once per process, when the registry is first needed. A plugin whose device
    or library is missing still registers its class: the class's ``is_available()``
    says why it cannot run, and onnxrt lists it as unavailable with that reason.
    """


@hookspec
def onnxrt_register_kernels(provider_name: str, registry: KernelRegistry) -> None:
    """Add kernels (custom ops, custom domains, or faster versions) to a provider.

    :param provider_name: the name of the provider whose registry is being built,
        e.g. ``"CPUExecutionProvider"``; add kernels only for providers you target.
    :param registry: that provider's :class:`onnxrt.plugin.kernel.KernelRegistry`; use
        ``registry.op("MyOp", since=1, domain="my.domain")`` as a decorator, or
        ``registry.register(KernelDef(...))``.
    :return: nothing; return values are ignored.

    Called once per provider class, the first time a session uses it.
    """


@hookspec
def onnxrt_register_transformers(registry: TransformerRegistry) -> None:
    """Add graph transforms, each with an optimization level.

    :param registry: a :class:`onnxrt.optimizer.TransformerRegistry`; call
        ``registry.add(name, fn, level=...)`` where ``fn(graph, ctx)`` rewrites an
        :class:`onnxrt.ir.Graph` in place and returns ``True`` if it changed anything.
        ``level`` is a :class:`onnxrt.GraphOptimizationLevel` (1 basic, 2 extended,
        99 all); the transform runs when the session's level is at least that.
        Users skip a transform by listing its ``name`` in ``disabled_optimizers``.
    :return: nothing; return values are ignored.

    Called once per process, when the transformer registry is first built.
    """
