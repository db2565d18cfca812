"""onnxruntime's ``log_severity_level`` applied to the ``onnxrt`` logger.

Severity 0 is verbose, 1 info, 2 warning (the default), 3 error, 4 fatal. A session
built with severity 0 or 1 lowers the ``onnxrt`` logger's level for the duration of
the build, so its partition decisions (logged at DEBUG) are visible. When no
handler would show them, a stderr handler is attached for that time, as
onnxruntime prints its own log to stderr.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading

__all__ = ["LEVEL_BY_SEVERITY", "session_logging"]

#: ``log_severity_level`` -> the ``logging`` level it selects.
LEVEL_BY_SEVERITY = {0: logging.DEBUG, 1: logging.INFO, 2: logging.WARNING, 3: logging.ERROR, 4: logging.CRITICAL}

_logger = logging.getLogger("onnxrt")
_lock = threading.RLock()


@contextlib.contextmanager
def session_logging(session_options):
    """Show the ``onnxrt`` log down to the session's ``log_severity_level`` while
    the block runs; a level at or above the logger's own changes nothing."""
    level = LEVEL_BY_SEVERITY.get(getattr(session_options, "log_severity_level", 2), logging.WARNING)
    if level >= _logger.getEffectiveLevel():
        yield
        return
    # the logger's level is process-wide: concurrent verbose builds take turns
    with _lock:
        old = _logger.level
        handler = None
        if not _logger.hasHandlers():
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter("onnxrt %(levelname)s: %(message)s"))
            _logger.addHandler(handler)
        _logger.setLevel(level)
        try:
            yield
        finally:
            _logger.setLevel(old)
            if handler is not None:
                _logger.removeHandler(handler)
