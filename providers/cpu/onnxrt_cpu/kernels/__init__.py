"""CPU kernels, one module per op family.

:func:`load_all` imports every module here, which registers its kernels into
:data:`onnxrt_cpu.registry.REGISTRY`.
"""

import importlib
import pkgutil

__all__ = ["MODULES", "load_all"]

MODULES = sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def load_all() -> None:
    """Import every kernel module (idempotent)."""
    for name in MODULES:
        importlib.import_module(f"{__name__}.{name}")
