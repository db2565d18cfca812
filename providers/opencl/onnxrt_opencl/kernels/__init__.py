"""The OpenCL kernels; importing this package registers every one of them."""

from __future__ import annotations

import importlib

_MODULES = ("elementwise", "datamove", "conv", "gemm", "pool", "reduce", "norm", "resize")


def load_all() -> None:
    """Import every kernel module (a module not written yet, or needing one, is skipped)."""
    ours = {f"{__name__}.{mod}" for mod in _MODULES}
    for mod in _MODULES:
        try:
            importlib.import_module(f"{__name__}.{mod}")
        except ModuleNotFoundError as e:
            if e.name not in ours:
                raise


load_all()
