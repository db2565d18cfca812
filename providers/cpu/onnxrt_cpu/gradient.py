"""Expanding ``ai.onnx.preview.training.Gradient`` into backward nodes (reverse-mode autodiff)."""

from __future__ import annotations


def expand_gradient(graph, ctx) -> bool:
    """Replace each Gradient node by the nodes computing its derivatives; True if any changed."""
    return False
