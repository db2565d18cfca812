"""Kernel threads: split work into chunks that a shared pool and the caller claim.

``parallel_for(count, fn)`` runs ``fn(0) ... fn(count - 1)`` over at most
:func:`onnxrt.run.threads.current_thread_count` threads: the calling thread and workers of
a process-wide pool. Chunks are claimed one at a time from a shared counter and the
caller claims too, so it never waits for a worker that has not started (on a loaded
machine it simply does all the chunks itself); it waits only for chunks a worker has
already begun. numpy releases the GIL inside BLAS calls and large copies, which is
where the chunks spend their time.

:func:`matmul` is a 2-D matrix product split this way over the rows or the columns
of the result, each part one single-threaded BLAS call writing into its slice of ``out``.
"""

from __future__ import annotations

import math
import os
import queue
import threading

import numpy as np

from onnxrt.run.threads import blas_architectures, current_thread_count

__all__ = ["BLAS_ALIGNMENT", "PARALLEL_MIN_FLOPS", "blas_aligned", "bounds", "matmul", "matmul_nd", "parallel_for", "thread_count"]

# OpenBLAS kernel sets whose single-precision GEMM uses AVX-512: about twice as many
# multiply-adds per core and second as the AVX2 (Haswell, Zen) ones.
_AVX512_KERNELS = frozenset({"skylakex", "cooperlake", "sapphirerapids"})


def _min_flops() -> int:
    """Handing work to another thread costs a wake-up, and every later hand-over of
    the GIL between the two threads another: on a 2-core virtual machine about 45 us
    each, and a split product took its serial time / 2 + about 110 us. A split pays
    once the serial product takes about 250 us: with AVX2 kernels, below 8M
    multiply-adds splitting lost and above 16M it won; with AVX-512 kernels 16M lost
    (181 -> 212-223 us for [1024, 64] x [64, 256]), 24M tied and 32M won
    (357 -> 316-323 us)."""
    try:
        fast = any(a.lower() in _AVX512_KERNELS for a in blas_architectures())
    except Exception:  # pragma: no cover - no BLAS information at all
        fast = False
    return (24 if fast else 12) << 20


#: Below this many multiply-adds a product runs on the calling thread alone (see
#: :func:`_min_flops`; it depends on the kernels the BLAS library uses).
PARALLEL_MIN_FLOPS = _min_flops()


def thread_count() -> int:
    """The threads the current run lets a kernel use."""
    return current_thread_count()


class _Job:
    __slots__ = ("fn", "count", "next", "finished", "lock", "done", "error")

    def __init__(self, fn, count):
        self.fn = fn
        self.count = count
        self.next = 0
        self.finished = 0
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.error = None

    def work(self):
        while True:
            with self.lock:
                i = self.next
                if i >= self.count:
                    return
                self.next = i + 1
            try:
                self.fn(i)
            except BaseException as e:  # re-raised in the calling thread
                if self.error is None:
                    self.error = e
            with self.lock:
                self.finished += 1
                if self.finished == self.count:
                    self.done.set()


class _Pool:
    def __init__(self):
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.workers: list[threading.Thread] = []
        self.lock = threading.Lock()

    def ensure(self, n: int) -> None:
        if len(self.workers) >= n:
            return
        with self.lock:
            while len(self.workers) < n:
                t = threading.Thread(target=self._loop, name=f"onnxrt-cpu-{len(self.workers)}", daemon=True)
                t.start()
                self.workers.append(t)

    def _loop(self):
        # numpy's error state is per thread: chunks run as quietly here as the run
        # loop makes them on the calling thread (inf and NaN are values, not warnings)
        with np.errstate(all="ignore"):
            while True:
                job = self.queue.get()
                job.work()


_pool = _Pool()


def _after_fork():  # pragma: no cover - exercised only in forked children
    global _pool
    _pool = _Pool()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def parallel_for(count: int, fn, threads: int | None = None) -> None:
    """Call ``fn(i)`` for every ``i < count``, over up to ``threads`` threads.

    Exceptions raised by any call are re-raised here (the first one) after every
    started call has finished.
    """
    n = min(count, threads if threads is not None else current_thread_count())
    if n <= 1:
        for i in range(count):
            fn(i)
        return
    job = _Job(fn, count)
    _pool.ensure(n - 1)
    for _ in range(n - 1):
        _pool.queue.put(job)
    job.work()
    job.done.wait()
    if job.error is not None:
        raise job.error


def bounds(total: int, parts: int, align: int = 1) -> list[int]:
    """Cut points splitting ``range(total)`` into at most ``parts`` pieces, each a
    multiple of ``align`` long but the last: ``[0, ..., total]``."""
    step = -(-total // parts)
    step = -(-step // align) * align
    return list(range(0, total, step)) + [total]


def matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None, epilogue=None) -> np.ndarray:
    """``a @ b`` for 2-D ``a`` ``[M, K]`` and ``b`` ``[K, N]``, split over the kernel threads.

    ``epilogue(part, rows, cols)``, if given, is called on each part of ``out`` (with
    the row and column slices it covers) right after that part is computed, on the
    thread that computed it: a bias or an activation then runs in parallel and while
    the part is still in cache.
    """
    m, k = a.shape
    n_ = b.shape[1]
    if out is None:
        out = np.empty((m, n_), dtype=np.result_type(a, b))
    threads = current_thread_count()
    work = m * k * n_
    everything = slice(None)
    if threads <= 1 or work < PARALLEL_MIN_FLOPS:
        np.matmul(a, b, out=out)
        if epilogue is not None:
            epilogue(out, everything, everything)
        return out
    # One part per thread: each part packs the operand it shares with the others
    # again, and every extra part is one more GIL hand-over. Two parts against four
    # on two threads, median of 30: [512, 4608] x [4608, 49] 1694 against 1862 us,
    # [256, 2304] x [2304, 196] 1531 against 1564, [256, 1024] x [1024, 256] 632
    # against 702, [1024, 64] x [64, 256] 225 against 252. Only far larger
    # products, whose parts no longer fit in cache, gained from more parts
    # ([2304, 64] x [64, 3136]: 5561 us in four, 5968 in two).
    parts = threads if work < 16 * PARALLEL_MIN_FLOPS else 2 * threads
    if m >= n_:
        cuts = bounds(m, parts, 8)

        def part(i):
            rows = slice(cuts[i], cuts[i + 1])
            np.matmul(a[rows], b, out=out[rows])
            if epilogue is not None:
                epilogue(out[rows], rows, everything)

    else:
        cuts = bounds(n_, parts, 16)

        def part(i):
            cols = slice(cuts[i], cuts[i + 1])
            np.matmul(a, b[:, cols], out=out[:, cols])
            if epilogue is not None:
                epilogue(out[:, cols], everything, cols)

    parallel_for(len(cuts) - 1, part, threads)
    return out


#: The boundary :func:`blas_aligned` places an operand's first element on: a cache
#: line, and a whole AVX-512 register.
BLAS_ALIGNMENT = 64


def blas_aligned(a: np.ndarray) -> np.ndarray:
    """A C-contiguous copy of ``a`` whose data starts on a :data:`BLAS_ALIGNMENT`-byte
    boundary, for a weight that BLAS reads in place on every call.

    A matrix-vector product reads its matrix as it lies (a product of matrices packs
    its operands into aligned buffers first), and numpy's allocations of a few
    hundred KiB start 16 bytes past a page: the recurrent product of a batch-1
    GRU step (``[1, 256] @ [256, 768]``, one thread) took 12.3 us on such an array
    against 8.5 us 32-byte aligned."""
    a = np.asarray(a)
    nbytes = a.size * a.itemsize
    raw = np.empty(nbytes + BLAS_ALIGNMENT, dtype=np.uint8)
    start = -raw.ctypes.data % BLAS_ALIGNMENT
    out = raw[start : start + nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


def matmul_nd(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``np.matmul(a, b)`` (any ranks, broadcast batches), split over the kernel threads.

    A stack times one matrix is always one tall 2-D product (numpy would loop over
    the stack, one small GEMM per item: the same sums, far slower). Float products
    big enough to be worth it are split: a 2-D product by rows or columns, a stack
    times a stack by batch item. Anything else (integers, 1-D operands, small
    products) is ``np.matmul``.
    """
    if a.ndim > 2 and b.ndim == 2:
        a2 = a.reshape(math.prod(a.shape[:-1]), a.shape[-1])
        # a product too small to split goes straight to numpy (the common case of
        # small models, where the checks below cost as much as a 256x32x64 product)
        out2 = np.matmul(a2, b) if a.size * b.shape[1] < PARALLEL_MIN_FLOPS else matmul_nd(a2, b)
        return out2.reshape(a.shape[:-1] + out2.shape[-1:])
    threads = current_thread_count()
    if (
        threads <= 1
        or a.ndim < 2
        or b.ndim < 2
        or a.dtype != b.dtype
        or a.dtype.kind != "f"
        or a.dtype.itemsize < 4
    ):
        return np.matmul(a, b)
    k = a.shape[-1]
    if b.shape[-2] != k:
        return np.matmul(a, b)  # numpy raises its own error
    rows = math.prod(a.shape[:-1])
    if rows * k * b.shape[-1] < PARALLEL_MIN_FLOPS:
        return np.matmul(a, b)
    if b.ndim == 2:  # a is 2-D too (a stack was flattened above)
        return matmul(a, b)
    try:
        batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except ValueError:
        return np.matmul(a, b)
    aa = np.broadcast_to(a, batch + a.shape[-2:]).reshape(-1, *a.shape[-2:])
    bb = np.broadcast_to(b, batch + b.shape[-2:]).reshape(-1, *b.shape[-2:])
    out = np.empty(batch + (a.shape[-2], b.shape[-1]), dtype=a.dtype)
    ov = out.reshape(-1, a.shape[-2], b.shape[-1])
    count = ov.shape[0]
    if count < 2:
        matmul(aa[0], bb[0], out=ov[0])
        return out
    parts = min(count, 2 * threads)
    cuts = bounds(count, parts)

    def part(i):
        np.matmul(aa[cuts[i] : cuts[i + 1]], bb[cuts[i] : cuts[i + 1]], out=ov[cuts[i] : cuts[i + 1]])

    parallel_for(len(cuts) - 1, part, threads)
    return out
