"""Process-wide settings and facts, as onnxruntime's module-level functions expose them.

``get_version_string`` and ``get_build_info`` describe this installation;
``set_global_thread_pool_sizes`` fixes the thread count of every session built with
``use_per_session_threads = False`` (onnxrt's kernels split work per run, so "global"
means one process-wide setting, not one shared set of threads); ``set_default_logger_severity`` and
``set_default_logger_callback`` route the ``onnxrt`` log; ``enable_telemetry_events``
and ``disable_telemetry_events`` exist for code that calls them: onnxrt sends no
telemetry, so both do nothing.
"""

from __future__ import annotations

import logging
import platform
import threading
from typing import Callable

from .errors import InvalidArgument

__all__ = [
    "get_version_string",
    "get_build_info",
    "enable_telemetry_events",
    "disable_telemetry_events",
    "set_default_logger_severity",
    "set_default_logger_verbosity",
    "set_default_logger_callback",
    "set_global_thread_pool_sizes",
    "global_thread_pool_sizes",
    "check_thread_pools",
]

_logger = logging.getLogger("onnxrt")
_lock = threading.Lock()
_global_pools: tuple[int, int] | None = None
_callback_handler: logging.Handler | None = None


def get_version_string() -> str:
    """This onnxrt's version, e.g. ``0.1.0``."""
    from . import __version__

    return __version__


def get_build_info() -> str:
    """One line about this build: version, Python, numpy and the installed providers."""
    import numpy as np

    from .plugin.discovery import get_all_providers

    return (f"onnxrt Build Info: version={get_version_string()}, pure Python, "
            f"python={platform.python_version()}, numpy={np.__version__}, "
            f"providers={','.join(get_all_providers())}")


def enable_telemetry_events() -> None:
    """Accepted for compatibility: onnxrt collects and sends no telemetry."""


def disable_telemetry_events() -> None:
    """Accepted for compatibility: onnxrt collects and sends no telemetry."""


def set_default_logger_severity(severity: int) -> None:
    """The ``onnxrt`` logger's level from onnxruntime's severity (0 verbose ... 4 fatal)."""
    from .logs import LEVEL_BY_SEVERITY

    if severity not in LEVEL_BY_SEVERITY:
        raise InvalidArgument(f"severity must be 0..4, not {severity!r}")
    _logger.setLevel(LEVEL_BY_SEVERITY[severity])


def set_default_logger_verbosity(verbosity: int) -> None:
    """Accepted for compatibility: onnxrt's verbose log has a single level (severity 0)."""
    if not isinstance(verbosity, int) or verbosity < 0:
        raise InvalidArgument(f"verbosity must be a non-negative int, not {verbosity!r}")


_SEVERITY_BY_LEVEL = {logging.DEBUG: 0, logging.INFO: 1, logging.WARNING: 2, logging.ERROR: 3, logging.CRITICAL: 4}


class _CallbackHandler(logging.Handler):
    def __init__(self, fn: Callable[[int, str, str, str, str], None]):
        super().__init__()
        self.fn = fn

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.fn(_SEVERITY_BY_LEVEL.get(record.levelno, 2), record.name, "", f"{record.pathname}:{record.lineno}",
                    record.getMessage())
        except Exception:  # noqa: BLE001 - a broken callback must not break a session
            self.handleError(record)


def set_default_logger_callback(callback: Callable[[int, str, str, str, str], None] | None) -> None:
    """Send every ``onnxrt`` log record to ``callback(severity, category, logid, code_location,
    message)`` as onnxruntime does; ``None`` removes the callback."""
    global _callback_handler
    if callback is not None and not callable(callback):
        raise InvalidArgument(f"the logger callback must be callable or None, not {type(callback).__name__}")
    with _lock:
        if _callback_handler is not None:
            _logger.removeHandler(_callback_handler)
            _callback_handler = None
        if callback is not None:
            _callback_handler = _CallbackHandler(callback)
            _logger.addHandler(_callback_handler)


def set_global_thread_pool_sizes(intra_op_num_threads: int = 0, inter_op_num_threads: int = 0) -> None:
    """Set the intra-op thread count of every session built with
    ``SessionOptions.use_per_session_threads = False`` (0: the cores this process may use;
    ``inter_op_num_threads`` is recorded, since onnxrt runs nodes in order). As in
    onnxruntime, once it is set every session must use it: building one with per-session
    threads (the default) is an error, and so is ``use_per_session_threads = False``
    before it is set."""
    global _global_pools
    for name, v in (("intra_op_num_threads", intra_op_num_threads), ("inter_op_num_threads", inter_op_num_threads)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise InvalidArgument(f"{name} must be a non-negative int, not {v!r}")
    with _lock:
        _global_pools = (intra_op_num_threads, inter_op_num_threads)


def global_thread_pool_sizes() -> tuple[int, int] | None:
    """The sizes given to :func:`set_global_thread_pool_sizes`, or ``None`` when never called."""
    return _global_pools


def check_thread_pools(session_options) -> int:
    """The intra-op thread count a session gets, after onnxruntime's rule on global pools:
    a session that shares them needs them set, and a session with its own threads cannot be
    built once they are."""
    from .errors import Fail

    per_session = getattr(session_options, "use_per_session_threads", True)
    pools = _global_pools
    if not per_session:
        if pools is None:
            raise Fail("use_per_session_threads is False but no global thread pools exist: "
                       "call set_global_thread_pool_sizes() before building the session")
        return pools[0]
    if pools is not None:
        raise Fail("the process uses global thread pools (set_global_thread_pool_sizes was called): "
                   "set SessionOptions.use_per_session_threads = False")
    return int(session_options.intra_op_num_threads)

