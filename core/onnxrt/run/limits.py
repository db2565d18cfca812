"""The allocation limit: a cap on any single tensor a model makes, checked before allocating.

A tiny model can ask for a huge tensor: a ``ConstantOfShape`` fed ``[1 << 20, 1 << 20]``,
a declared initializer of a trillion elements, a ``Range`` with a huge limit. On Linux
``np.zeros(huge)`` may even succeed (memory is overcommitted) and the process is killed
later, when the pages are touched, so the size has to be checked *before* allocating.

The contract, for every provider:

- ``SessionOptions.max_allocation_bytes`` (or the session config entry
  ``session.max_allocation_bytes``) sets the cap; the default is
  :func:`default_max_allocation_bytes`.
- While a session builds (initializers, constant folding) and while a plan runs, the
  cap is held in a context variable; :func:`allocation_limit` reads it.
- A kernel whose output size comes from input *values* or attributes rather than
  input sizes (ConstantOfShape, Expand, Tile, Range, Pad, OneHot, Resize, the random
  generators, ...) calls :func:`check_allocation` with the shape it is about to make.
  Over the cap it raises :class:`~onnxrt.errors.InvalidArgument` naming the shape,
  the bytes and the cap; the run loop adds the node, the op and the provider.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterable, Iterator

import numpy as np

from ..errors import InvalidArgument

__all__ = [
    "default_max_allocation_bytes",
    "allocation_limit",
    "limit_allocations",
    "check_allocation",
    "checked_size",
    "process_memory_limit",
    "session_max_bytes",
    "CONFIG_KEY",
]

#: The session config entry that overrides ``SessionOptions.max_allocation_bytes``.
CONFIG_KEY = "session.max_allocation_bytes"

_FALLBACK_BYTES = 8 << 30


def _physical_memory() -> int | None:
    try:
        phys = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # pragma: no cover - non-POSIX
        return None
    # a container's cgroup limit is the memory this process can really have
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < phys:
            phys = int(text)
    return phys if phys > 0 else None


def process_memory_limit() -> int | None:
    """The memory this process may use: physical memory, or the cgroup limit, or the
    address-space limit (``RLIMIT_AS``), whichever is smallest; None where unknown."""
    phys = _physical_memory()
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        unlimited = resource.RLIM_INFINITY
    except (ImportError, ValueError, OSError):  # pragma: no cover - non-POSIX
        return phys
    if soft != unlimited and soft > 0:
        phys = soft if phys is None else min(phys, soft)
    return phys


def default_max_allocation_bytes() -> int:
    """Half of the memory this process can have (physical memory, or the cgroup limit).

    Falls back to 8 GiB where the platform does not say.
    """
    phys = _physical_memory()
    return phys // 2 if phys else _FALLBACK_BYTES


_limit: contextvars.ContextVar[int | None] = contextvars.ContextVar("onnxrt_max_allocation_bytes", default=None)
_default_cache: list[int] = []


def session_max_bytes(so) -> int:
    """A session's allocation cap: its config entry :data:`CONFIG_KEY` if set, else
    ``SessionOptions.max_allocation_bytes``."""
    text = so._config.get(CONFIG_KEY)
    if text is None:
        return int(so.max_allocation_bytes)
    try:
        value = int(text.strip())
    except ValueError:
        value = 0
    if value <= 0:
        raise InvalidArgument(f"session config entry {CONFIG_KEY!r} must be a positive integer, not {text!r}")
    return value


def allocation_limit() -> int:
    """The cap in force: the running session's, or the process default outside a session."""
    v = _limit.get()
    if v is not None:
        return v
    if not _default_cache:
        _default_cache.append(default_max_allocation_bytes())
    return _default_cache[0]


@contextlib.contextmanager
def limit_allocations(max_bytes: int) -> Iterator[None]:
    """Hold ``max_bytes`` as the cap for the code inside the ``with`` block (this thread/task)."""
    token = _limit.set(int(max_bytes))
    try:
        yield
    finally:
        _limit.reset(token)


def checked_size(shape: Iterable, what: str) -> tuple[int, ...]:
    """``shape`` as a tuple of non-negative ints; a negative or non-integer entry is an error."""
    dims = []
    for d in shape:
        try:
            di = int(d)
        except (TypeError, ValueError, OverflowError):
            raise InvalidArgument(f"{what}: shape {list(shape)} has a non-integer dimension {d!r}") from None
        if di < 0:
            raise InvalidArgument(f"{what}: shape {list(shape)} has a negative dimension {di}")
        dims.append(di)
    return tuple(dims)


def check_allocation(shape: Iterable, dtype, what: str) -> tuple[int, ...]:
    """Refuse a tensor of ``shape`` and ``dtype`` larger than the cap, before it is made.

    :param shape: the dimensions about to be allocated (ints or integer numpy scalars).
    :param dtype: anything ``numpy.dtype`` accepts; object (string) tensors count 8
        bytes per element, the size of the references.
    :param what: names the thing being made in the message, e.g. ``"ConstantOfShape output"``.
    :returns: the shape as a tuple of Python ints.
    :raises InvalidArgument: a negative dimension, or a size over the cap.
    """
    dims = checked_size(shape, what)
    n = 1
    for d in dims:
        n *= d  # Python ints: no overflow
    itemsize = max(1, np.dtype(dtype).itemsize)
    nbytes = n * itemsize
    cap = allocation_limit()
    if nbytes > cap:
        raise InvalidArgument(
            f"{what}: a tensor of shape {list(dims)} ({np.dtype(dtype)}) needs {nbytes} bytes, over the "
            f"session's max_allocation_bytes ({cap}); raise SessionOptions.max_allocation_bytes "
            f"if the model really needs it"
        )
    return dims
