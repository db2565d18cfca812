"""Thread settings for BLAS and kernels.

How onnxrt uses the cores
-------------------------
``SessionOptions.intra_op_num_threads`` (default: the cores this process may use,
``os.sched_getaffinity``) is the number of threads a kernel may split its work over.
The CPU kernels split large matrix products and convolutions into chunks that a
small pool of worker threads and the calling thread claim one at a time
(:func:`current_thread_count` tells a kernel its budget). The calling thread keeps
claiming chunks until none is left, so a worker that the OS does not schedule in time
delays nothing: on a loaded machine the run degrades to single-threaded speed instead of
waiting on a sleeping thread.

numpy's BLAS (OpenBLAS) splits every product statically over its own threads and then
waits for all of them; on a busy 2-core machine one product of a few MFLOP was measured
at 40 ms with two OpenBLAS threads against 0.2 ms with one. So while any onnxrt run
is in progress BLAS is single-threaded: the first run to start sets it to one thread,
the last one to finish restores the previous setting (a count shared by all sessions,
under a lock). Because every session asks BLAS for the same thing, sessions with
different ``intra_op_num_threads`` run side by side, from different threads, without
changing each other's settings; each one's kernel threads are its own budget. numpy
code that the application runs in another thread during an onnxrt run also sees BLAS
single-threaded for that time.

OpenBLAS core type
------------------
OpenBLAS picks its kernels for the CPU when numpy loads, unless ``OPENBLAS_CORETYPE``
says otherwise. On an AVX-512 machine (AMD EPYC, Zen 4) it picks its SkylakeX
kernels by itself; with ``OPENBLAS_CORETYPE=Haswell`` in the environment it uses AVX2
kernels, and single-precision GEMM runs at about half the speed (110 against 210
GFLOP/s per core, measured on convolution-shaped products). onnxrt leaves the
variable alone: it is the user's, it must be set before numpy loads, and where it is
not set OpenBLAS already chooses well. See ``docs/benchmarks.md``.
"""

from __future__ import annotations

import os
import threading

__all__ = [
    "ThreadSettings",
    "add_idle_hook",
    "current_thread_count",
    "limit_blas_threads",
    "blas_architectures",
    "blas_threads",
]


def _default_threads() -> int:
    from ..options import default_thread_count

    return default_thread_count()


# -- BLAS -----------------------------------------------------------------------------

_lock = threading.Lock()
_blas = None  # a _Blas per BLAS library loaded when first needed
_active_runs = 0
_saved: list = []
_process_limit_done = False


class _Blas:
    """Get and set one BLAS library's thread count from any thread.

    threadpoolctl lets only the first thread that sets OpenBLAS's (process-wide,
    pthreads) limit change it later; the others are silently ignored. Runs start on
    any thread, so for OpenBLAS this calls its own ``openblas_set_num_threads``
    directly, and uses threadpoolctl for the other libraries.
    """

    def __init__(self, controller):
        self.controller = controller
        self._get = self._set = None
        if controller.internal_api == "openblas" and getattr(controller, "threading_layer", "") != "openmp":
            for prefix in ("", "scipy_"):
                for suffix in ("", "64_", "_64"):
                    get = getattr(controller.dynlib, f"{prefix}openblas_get_num_threads{suffix}", None)
                    set_ = getattr(controller.dynlib, f"{prefix}openblas_set_num_threads{suffix}", None)
                    if get is not None and set_ is not None:
                        self._get, self._set = get, set_
                        # the C functions themselves (ctypes returns a C int as an int):
                        # a run reads the count through them with no method between
                        self.get, self.set = get, set_
                        return

    def get(self) -> int:
        return int(self._get()) if self._get is not None else int(self.controller.get_num_threads())

    def set(self, n: int) -> None:  # the C function itself where there is one (an int argument)
        if self._set is not None:
            self._set(int(n))
        else:
            self.controller.set_num_threads(int(n))


def _blas_controllers() -> list:
    global _blas
    if _blas is None:
        try:
            from threadpoolctl import ThreadpoolController

            _blas = [_Blas(c) for c in ThreadpoolController().lib_controllers if c.user_api == "blas"]
        except Exception:  # pragma: no cover - threadpoolctl missing or no BLAS found
            _blas = []
    return _blas


def limit_blas_threads(n: int | None = None) -> None:
    """Limit BLAS threads process-wide (once, to the usable cores, by default).

    numpy's OpenBLAS starts as many threads as the host has cores, not as this process
    may use; outside onnxrt runs this keeps the application's own numpy from
    oversubscribing a small container.
    """
    global _process_limit_done
    with _lock:
        if _process_limit_done and n is None:
            return
        for c in _blas_controllers():
            try:
                c.set(int(n or _default_threads()))
            except Exception:  # pragma: no cover
                pass
        _process_limit_done = True


def _limit_for_run() -> None:
    """Set each BLAS library to one thread, remembering the counts to give back (under
    ``_lock``, by the first run to start). A library already at one thread is neither
    set nor restored: a run of a small model then makes one call per library (the read)
    instead of three."""
    global _saved
    _saved = []
    for c in _blas_controllers():
        try:
            n = c.get()
            if n != 1:
                c.set(1)
                _saved.append((c, n))
        except Exception:  # pragma: no cover
            pass


def _enter_run() -> None:
    global _active_runs
    with _lock:
        if _active_runs == 0:
            _limit_for_run()
        _active_runs += 1


#: Called (without arguments) whenever the last run in progress ends: see add_idle_hook.
_idle_hooks: list = []


def add_idle_hook(fn) -> None:
    """Call ``fn()`` whenever no onnxrt run is in progress any more (the last of the
    concurrent runs has ended).

    A provider whose worker threads busy-wait between the kernels of a run, as the CPU
    provider's compiled pool does, uses it to let them sleep at once: between runs
    their spinning would only take cores from the application (or from another
    runtime timed beside onnxrt). ``fn`` must be quick and must not raise; it may be
    called from any thread that ran a session."""
    if fn not in _idle_hooks:
        _idle_hooks.append(fn)


def _exit_run() -> None:
    global _active_runs
    with _lock:
        _active_runs -= 1
        idle = _active_runs == 0
        if idle:
            for c, n in _saved:
                try:
                    c.set(n)
                except Exception:  # pragma: no cover
                    pass
    if idle:
        for fn in _idle_hooks:
            try:
                fn()
            except Exception:  # pragma: no cover - a hook must not break the run that ended
                pass


def _after_fork_in_child() -> None:  # pragma: no cover - exercised only in forked children
    """A child forked during a run has no run in progress: give BLAS back its count."""
    global _active_runs, _lock
    _lock = threading.Lock()
    if _active_runs:
        _active_runs = 0
        for c, n in _saved:
            try:
                c.set(n)
            except Exception:
                pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def blas_architectures() -> list[str]:
    """The kernel set each loaded BLAS library chose or was told to use (OpenBLAS's
    core name, such as ``"Haswell"`` or ``"SkylakeX"``); empty where it says none."""
    out = []
    for c in _blas_controllers():
        arch = getattr(c.controller, "architecture", None)
        if arch:
            out.append(str(arch))
    return out


def blas_threads() -> list[int]:
    """The thread count of each loaded BLAS library now (for tests and diagnostics)."""
    out = []
    for c in _blas_controllers():
        try:
            out.append(c.get())
        except Exception:  # pragma: no cover
            pass
    return out


# -- per-run kernel threads -----------------------------------------------------------

_local = threading.local()


def current_thread_count() -> int:
    """How many threads a kernel called from this thread may use (1 outside a run)."""
    return getattr(_local, "n", 1)


class ThreadSettings:
    """A context manager applying a session's thread count around a run.

    Re-entrant and thread-safe: one instance serves every thread that runs the
    session, and a run nested in another (a subgraph, a custom kernel running a
    session) restores the outer run's count when it ends.
    """

    def __init__(self, intra_op_num_threads: int = 0):
        limit_blas_threads()
        self.n = int(intra_op_num_threads) if intra_op_num_threads else _default_threads()

    def __enter__(self):
        # _enter_run inlined: this runs around every run, tiny models' included
        global _active_runs
        with _lock:
            if _active_runs == 0:
                _limit_for_run()
            _active_runs += 1
        local = _local
        try:
            local.stack.append(local.n)
        except AttributeError:
            local.stack = [getattr(local, "n", 1)]
        local.n = self.n
        return self

    def __exit__(self, *exc):
        local = _local
        local.n = local.stack.pop()
        _exit_run()
        return False
