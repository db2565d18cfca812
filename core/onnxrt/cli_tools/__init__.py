"""The ``onnxrt`` verbs beyond ``run`` and ``providers``, one module each.

Each module has ``add_command(subparsers)``, which adds its verb with a ``func``
default that takes the parsed arguments and returns the exit status.
"""

from __future__ import annotations

from . import bench, compare, explain, optimize, profile

__all__ = ["add_commands"]

_VERBS = (explain, profile, bench, compare, optimize)


def add_commands(subparsers) -> None:
    """Add every verb of this package to the ``onnxrt`` argument parser."""
    for verb in _VERBS:
        verb.add_command(subparsers)
