"""The C heap's thresholds, set once per process so that runs do not page-fault.

Every intermediate tensor is a fresh numpy array, and numpy takes its memory from the
C library's ``malloc``. glibc hands blocks of 128 KiB or more out of fresh ``mmap``
regions, and gives free memory at the top of its heap back to the system once more
than 128 KiB of it is free. It raises both thresholds by itself, but only after a
large ``mmap``-ed block has been freed, and only as far as the largest such block.

A model whose intermediates are all a few hundred KiB (a transformer encoder at batch
8, a quantized model) never takes it there: every run maps, touches and returns the
same pages again, a page fault per 4 KiB. Measured on a quantized transformer encoder
(batch 8, 2 threads): about 500 page faults and 3.6 ms per run, against none and
2.4 ms with the thresholds below. Large CNNs free a big block in their first run and
were already at the ceiling.

:func:`tune_heap` sets what glibc's own adjustment would reach at its ceiling: blocks
under 32 MiB come from the heap, and up to 64 MiB of free heap is kept for the next
run. Memory held this way is reused by the next run, so a process's peak (its
resident high-water mark) is unchanged; what changes is that up to 64 MiB stays
mapped between runs. onnxruntime keeps its own arena for the same reason.

It is process-wide and done once, at the first session's creation. Set the
environment variable ``ONNXRT_TUNE_HEAP=0``, or the session config entry
``session.tune_heap`` to ``"0"`` on the first session, to leave the C library's
settings alone. On a C library without ``mallopt`` (musl, macOS, Windows) it does
nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import threading

__all__ = ["CONFIG_KEY", "MMAP_THRESHOLD", "TRIM_THRESHOLD", "heap_tuned", "tune_heap"]

logger = logging.getLogger("onnxrt")

#: The session config entry that turns the tuning off for a session (``"0"``).
CONFIG_KEY = "session.tune_heap"
#: Blocks at least this large still get their own mapping (glibc's own ceiling).
MMAP_THRESHOLD = 32 << 20
#: Free memory kept at the top of the heap between runs.
TRIM_THRESHOLD = 64 << 20

# glibc's mallopt parameter numbers (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

_lock = threading.Lock()
_state: dict[str, bool | None] = {"tuned": None}


def _mallopt():
    """glibc's ``mallopt``, or None where the C library has none."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
        fn = libc.mallopt
    except (OSError, AttributeError):
        return None
    # musl exports a mallopt that does nothing; only glibc has the thresholds
    try:
        libc.gnu_get_libc_version
    except AttributeError:
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def tune_heap(enabled: bool = True) -> bool:
    """Set the heap thresholds once per process; return whether they are set.

    The first call decides: later calls return what it did. ``enabled=False``, or
    ``ONNXRT_TUNE_HEAP=0`` in the environment, leaves the C library's settings alone.
    """
    with _lock:
        if _state["tuned"] is not None:
            return bool(_state["tuned"])
        tuned = False
        if enabled and os.environ.get("ONNXRT_TUNE_HEAP", "1").strip() not in ("0", "false", "no", "off"):
            fn = _mallopt()
            if fn is not None:
                # mmap first: setting either threshold ends glibc's own adjustment
                tuned = bool(fn(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(fn(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
                logger.debug("heap thresholds: mmap %d, trim %d (%s)", MMAP_THRESHOLD, TRIM_THRESHOLD,
                             "set" if tuned else "refused")
        _state["tuned"] = tuned
        return tuned


def heap_tuned() -> bool | None:
    """Whether :func:`tune_heap` set the thresholds (None: not called yet)."""
    return _state["tuned"]
