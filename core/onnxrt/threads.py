"""Thread settings for BLAS and kernels.

numpy's OpenBLAS starts as many threads as the host has cores, not as this process
may use; in a small container that oversubscribes badly. The first session limits
BLAS to the cores this process may use. A session with its own
``intra_op_num_threads`` applies it around each of its runs only, so sessions with
different settings do not disturb each other.
"""

from __future__ import annotations

import threading

from .options import default_thread_count

__all__ = ["ThreadSettings", "limit_blas_threads"]

_process_limit_done = False
_lock = threading.Lock()


def limit_blas_threads(n: int | None = None) -> None:
    """Limit BLAS threads process-wide (once, to the usable cores by default)."""
    global _process_limit_done
    with _lock:
        if _process_limit_done and n is None:
            return
        try:
            from threadpoolctl import threadpool_limits

            threadpool_limits(limits=n or default_thread_count(), user_api="blas")
        except Exception:  # pragma: no cover - threadpoolctl missing or no BLAS found
            pass
        _process_limit_done = True


class ThreadSettings:
    """A context manager applying a session's thread count around a run."""

    def __init__(self, intra_op_num_threads: int = 0):
        limit_blas_threads()
        self.n = intra_op_num_threads
        self._ctl = None
        if intra_op_num_threads and intra_op_num_threads != default_thread_count():
            try:
                from threadpoolctl import ThreadpoolController

                self._ctl = ThreadpoolController()
            except Exception:  # pragma: no cover
                self._ctl = None
        self._local = threading.local()

    def __enter__(self):
        if self._ctl is not None:
            self._local.cm = self._ctl.limit(limits=self.n, user_api="blas")
            self._local.cm.__enter__()
        return self

    def __exit__(self, *exc):
        if self._ctl is not None:
            self._local.cm.__exit__(*exc)
        return False
