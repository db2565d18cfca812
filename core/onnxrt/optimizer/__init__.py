"""Graph transforms, by name and level.

Each transform is ``fn(graph, ctx) -> bool`` (whether it changed the graph) with a
name and a :class:`~onnxrt.options.GraphOptimizationLevel`. Level-1 (basic)
transforms are provider independent and run before partitioning; higher levels run
after it, and a fusion applies only where the provider owning the nodes has a
kernel for the fused op. ``SessionOptions.disabled_optimizers`` skips transforms by
name. Plugins add transforms through the ``onnxrt_register_transformers`` hook.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

from ..options import GraphOptimizationLevel

__all__ = ["Transformer", "TransformerRegistry", "OptimizeContext", "transformer_registry",
           "reset_transformer_registry", "run_transforms"]

logger = logging.getLogger("onnxrt")


@dataclass
class Transformer:
    """A named graph rewrite that runs at ``level`` and above."""

    name: str
    fn: Callable
    level: int
    #: "expand" always runs first, whatever the level (rewrites that give ops their
    #: meaning, such as expanding Gradient); "pre" runs before partitioning
    #: (provider independent); "post" after it
    phase: str = "pre"


class TransformerRegistry:
    """Named transforms; what ``onnxrt_register_transformers`` receives."""

    def __init__(self) -> None:
        self._by_name: dict[str, Transformer] = {}

    def add(self, name: str, fn: Callable, level: int = GraphOptimizationLevel.ORT_ENABLE_BASIC,
            phase: str | None = None) -> None:
        """Register ``fn(graph, ctx) -> bool`` under ``name``.

        :param level: the lowest session optimization level that runs it.
        :param phase: ``"expand"`` (always runs, at every level including
            ``ORT_DISABLE_ALL``: for rewrites a model needs to run at all), ``"pre"``
            (before partitioning) or ``"post"``; by default basic transforms run before
            partitioning and higher levels after it.
        """
        if name in self._by_name:
            raise ValueError(f"a graph transform named {name!r} is already registered")
        if phase is None:
            phase = "pre" if int(level) <= GraphOptimizationLevel.ORT_ENABLE_BASIC else "post"
        if phase not in ("expand", "pre", "post"):
            raise ValueError(f"phase must be 'expand', 'pre' or 'post', not {phase!r}")
        self._by_name[name] = Transformer(name, fn, int(level), phase)

    def names(self) -> list[str]:
        """Every registered transform name."""
        return list(self._by_name)

    def select(self, level: int, phase: str, disabled: set[str]) -> list[Transformer]:
        """The transforms of ``phase`` that run at ``level``, in registration order."""
        if phase == "expand":
            return [t for t in self._by_name.values() if t.phase == "expand"]
        return [t for t in self._by_name.values() if t.level <= level and t.phase == phase and t.name not in disabled]


class OptimizeContext:
    """What transforms may consult: providers, kernel lookup, limits."""

    def __init__(self, providers, node_info, cpu_registry, max_bytes: int, session_options=None):
        self.providers = providers
        self.node_info = node_info
        self.cpu_registry = cpu_registry
        self.max_bytes = max_bytes
        self.session_options = session_options

    def provider_has_kernel(self, provider_name: str, node) -> bool:
        """Whether ``provider_name`` can run ``node`` (used by fusions)."""
        for p in self.providers:
            if p.name == provider_name:
                kdef, _ = p.kernel_registry().find(self.node_info(node))
                return kdef is not None
        return False


_registry: TransformerRegistry | None = None


def transformer_registry() -> TransformerRegistry:
    """Built-in transforms plus those plugins registered."""
    global _registry
    if _registry is None:
        reg = TransformerRegistry()
        from . import basic, castlike, float16_compute, fusions

        basic.register(reg)
        castlike.register(reg)
        # first of the "post" phase: the fusions then see float32 nodes
        float16_compute.register(reg)
        fusions.register(reg)
        from ..plugin.discovery import plugin_manager

        plugin_manager().hook.onnxrt_register_transformers(registry=reg)
        _registry = reg
    return _registry


def reset_transformer_registry() -> None:
    """Forget the built registry (after plugins change)."""
    global _registry
    _registry = None


def run_transforms(graph, ctx: OptimizeContext, level: int, phase: str, disabled: set[str], max_rounds: int = 5) -> list[str]:
    """Apply the selected transforms until nothing changes; return the names that fired."""
    fired: list[str] = []
    if level <= 0 and phase != "expand":
        return fired
    transforms = transformer_registry().select(level, phase, disabled)
    for _ in range(max_rounds):
        changed = False
        for t in transforms:
            if t.fn(graph, ctx):
                fired.append(t.name)
                changed = True
                logger.debug("transform %s changed graph %r", t.name, graph.name)
        if not changed:
            break
    return fired
