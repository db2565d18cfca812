"""Finding CuPy and a usable GPU, and the per-thread stream and memory-pool scope.

:func:`availability` never raises: CuPy missing, no device, or a driver older than
the CUDA runtime CuPy was built for each become a reason string that
``onnxrt.get_provider_info()`` shows and that ``EPFail`` carries when a session asks
for the provider by name.
"""

from __future__ import annotations

import threading
from contextlib import ExitStack
from typing import Any

__all__ = ["DeviceScope", "availability", "import_cupy", "reset_availability"]

_lock = threading.Lock()
_cache: dict[int, str | None] = {}


def import_cupy():
    """Import and return ``cupy`` (raises ImportError, or OSError for broken CUDA libraries)."""
    import cupy

    return cupy


def _versions(rt) -> str:
    """``driver X, runtime Y`` as far as CuPy can tell (each may be unknown)."""
    parts = []
    for label, fn in (("driver", "driverGetVersion"), ("runtime", "runtimeGetVersion")):
        try:
            v = int(getattr(rt, fn)())
            parts.append(f"{label} {_fmt_version(v)}")
        except Exception:  # noqa: BLE001 - a version we cannot read is just left out
            parts.append(f"{label} unknown")
    return ", ".join(parts)


def _fmt_version(v: int) -> str:
    # CUDA encodes 12.4 as 12040; a driver version of 0 means no driver is loaded
    if v == 0:
        return "none"
    return f"{v // 1000}.{(v % 1000) // 10}"


def check(device_id: int = 0) -> str | None:
    """``None`` when CuPy imports and ``device_id`` runs a tiny kernel; otherwise why not."""
    try:
        cp = import_cupy()
    except Exception as e:  # noqa: BLE001 - ImportError, or OSError from missing CUDA libraries
        return (f"CuPy is not installed or cannot be imported ({type(e).__name__}: {e}); "
                "install onnxrt-cuda[cuda12] or onnxrt-cuda[cuda13]")
    rt = cp.cuda.runtime
    try:
        count = int(rt.getDeviceCount())
    except Exception as e:  # noqa: BLE001 - CUDARuntimeError: no driver, too old a driver
        return f"no usable CUDA device: {type(e).__name__}: {e} ({_versions(rt)})"
    if count == 0:
        return f"no CUDA device found ({_versions(rt)})"
    if not 0 <= device_id < count:
        return f"device_id {device_id} is out of range: {count} CUDA device(s) found"
    try:
        with cp.cuda.Device(device_id):
            x = cp.arange(4, dtype=cp.float32)
            if float((x * 2).sum()) != 12.0:
                return "a test kernel on the CUDA device gave a wrong result"
    except Exception as e:  # noqa: BLE001 - NVRTC missing, runtime mismatch, out of memory
        return f"the CUDA device cannot run a test kernel: {type(e).__name__}: {e} ({_versions(rt)})"
    return None


def availability(device_id: int = 0) -> str | None:
    """:func:`check`, computed once per process and device."""
    with _lock:
        if device_id not in _cache:
            _cache[device_id] = check(device_id)
        return _cache[device_id]


def reset_availability() -> None:
    """Forget cached availability (tests that simulate missing pieces use this)."""
    with _lock:
        _cache.clear()


class DeviceScope:
    """Makes one device, this thread's stream and the session's allocator current.

    Each thread gets its own stream, so concurrent runs of one session never wait on
    each other's work; a run's work is ordered on its thread's stream. The streams are
    blocking ones: they are ordered with the legacy default stream, which CuPy and
    PyTorch use unless told otherwise, so a device array the caller wrote there is
    complete before a run reads it, and the caller's reads of an output (or a copy into
    a bound output buffer made there) wait for the run's kernels.
    """

    def __init__(self, device_id: int, allocator: Any):
        self.cp = import_cupy()
        self.device_id = device_id
        self.allocator = allocator
        self._local = threading.local()

    def stream(self):
        """This thread's stream on the device."""
        s = getattr(self._local, "stream", None)
        if s is None:
            with self.cp.cuda.Device(self.device_id):
                s = self.cp.cuda.Stream(non_blocking=False)
            self._local.stream = s
        return s

    def __enter__(self):
        local = self._local
        depth = getattr(local, "depth", 0)
        local.depth = depth + 1
        if depth:
            # already current on this thread (the run's scope, or an outer kernel's)
            return self
        cp = self.cp
        ctxs = [cp.cuda.Device(self.device_id), self.stream()]
        if self.allocator is not _DEFAULT:
            ctxs.append(cp.cuda.using_allocator(self.allocator))
        try:
            with ExitStack() as stack:
                for c in ctxs:
                    stack.enter_context(c)
                local.ctxs = stack.pop_all()
        except BaseException:
            local.depth = depth
            raise
        return self

    def __exit__(self, *exc):
        local = self._local
        local.depth -= 1
        if local.depth == 0:
            ctxs, local.ctxs = local.ctxs, None
            ctxs.__exit__(*exc)
        return False


#: "use CuPy's default allocator" (distinct from ``None``, which CuPy reads as "no pool")
_DEFAULT = object()
DEFAULT_ALLOCATOR = _DEFAULT
