"""The OpenCL runtime: one context, one in-order queue, a program cache and a buffer pool.

A :class:`CLRuntime` exists once per (platform, device, memory limit) in a process and is
shared by every session that asks for the same device, so programs built for one session
are reused by the next (PoCL compiles each new program, which is slow).

Kernels call :meth:`CLRuntime.launch`; it sets the arguments and enqueues under a lock
held per kernel object, because ``clSetKernelArg`` is not thread-safe. The single queue
is in-order, so a buffer that goes back to the pool after its last use can be handed to
the next allocation without waiting: every later command runs after every earlier one.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from onnxrt.errors import EPFail, Fail, InvalidArgument

__all__ = ["CLRuntime", "get_runtime", "select_device", "LaunchCounter"]

_TRIVIAL_KERNEL = "__kernel void onnxrt_probe(__global float *x) { x[get_global_id(0)] += 1.0f; }"


def _cl():
    import pyopencl as cl

    return cl


def _match(items: list, want, what: str, kind_of: str):
    """Pick ``items[want]`` (an index) or the first whose name contains ``want``."""
    if isinstance(want, str) and want.strip().lstrip("-").isdigit():
        want = int(want)
    if isinstance(want, int):
        if not 0 <= want < len(items):
            raise InvalidArgument(f"OpenCL {what} index {want} is out of range; {kind_of} has {len(items)}")
        return items[want]
    needle = str(want).lower()
    for it in items:
        if needle in it.name.lower():
            return it
    names = ", ".join(repr(it.name.strip()) for it in items) or "none"
    raise InvalidArgument(f"no OpenCL {what} whose name contains {want!r} ({kind_of} has: {names})")


def select_device(platform=None, device=None):
    """Return the ``cl.Device`` chosen by a platform and a device selector.

    Each selector is an index or a case-insensitive name substring; ``None`` picks the
    first GPU of any (or the chosen) platform, else the first device of any type.

    :raises InvalidArgument: when a selector matches nothing.
    :raises EPFail: when there is no OpenCL platform or device at all.
    """
    cl = _cl()
    try:
        platforms = cl.get_platforms()
    except cl.Error as e:  # the ICD loader reports "no platforms" as an error
        raise EPFail(f"no OpenCL platform found ({e})") from None
    if not platforms:
        raise EPFail("no OpenCL platform found")
    if platform is not None:
        platforms = [_match(platforms, platform, "platform", "this machine")]
    devices = []
    for p in platforms:
        try:
            devices.extend(p.get_devices())
        except cl.Error:  # a platform with no devices raises DEVICE_NOT_FOUND
            continue
    if not devices:
        where = f"platform {platforms[0].name!r}" if platform is not None else "any OpenCL platform"
        raise EPFail(f"no OpenCL device on {where}")
    if device is not None:
        return _match(devices, device, "device", "the platform" if platform is not None else "this machine")
    gpus = [d for d in devices if d.type & cl.device_type.GPU]
    return (gpus or devices)[0]


class LaunchCounter:
    """Counts kernel launches (tests and benchmarks read it; cheap enough to keep on)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0

    def add(self) -> None:
        with self._lock:
            self.count += 1


class CLRuntime:
    """One OpenCL context and queue, with a program cache and a pooled allocator.

    :ivar ctx: the ``cl.Context``.
    :ivar device: the ``cl.Device``.
    :ivar queue: the one in-order ``cl.CommandQueue`` every kernel and copy goes through.
    :ivar has_fp64: whether the device computes in double precision.
    :ivar has_fp16: whether the device supports ``cl_khr_fp16``.
    :ivar max_work_group_size: the device's largest work-group.
    :ivar memory_limit: the pool's limit in bytes (0: no limit).
    :ivar launches: a :class:`LaunchCounter` of every :meth:`launch`.
    """

    def __init__(self, device, memory_limit: int = 0):
        cl = _cl()
        import pyopencl.tools as cl_tools

        self.device = device
        self.ctx = cl.Context([device])
        self.queue = cl.CommandQueue(self.ctx)
        self.has_fp64 = bool(device.double_fp_config)
        self.has_fp16 = "cl_khr_fp16" in device.extensions
        self.max_work_group_size = int(device.max_work_group_size)
        self.memory_limit = int(memory_limit)
        self.launches = LaunchCounter()
        self._pool = cl_tools.MemoryPool(cl_tools.ImmediateAllocator(self.queue))
        self._pool_lock = threading.Lock()
        self._programs: dict[tuple[str, tuple[str, ...]], Any] = {}
        self._programs_lock = threading.Lock()
        self._kernels: dict[tuple[Any, str], tuple[Any, threading.Lock]] = {}
        self._kernels_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<CLRuntime {self.device.name.strip()!r} on {self.device.platform.name.strip()!r}>"

    @property
    def device_name(self) -> str:
        """The device's name, as its driver reports it."""
        return self.device.name.strip()

    # -- programs and launches -------------------------------------------------------
    def program(self, source: str, options: tuple[str, ...] = ()) -> Any:
        """Build ``source`` once (cached by source and options) and return the ``cl.Program``.

        :raises EPFail: the build failed; the message carries the build log.
        """
        key = (source, tuple(options))
        prg = self._programs.get(key)
        if prg is not None:
            return prg
        with self._programs_lock:
            prg = self._programs.get(key)
            if prg is None:
                cl = _cl()
                try:
                    prg = cl.Program(self.ctx, source).build(options=list(options))
                except cl.Error as e:
                    raise EPFail(f"OpenCL build failed on {self.device_name}: {e}\n--- source ---\n{source}") from None
                self._programs[key] = prg
        return prg

    def _kernel(self, program, name: str):
        key = (program, name)
        entry = self._kernels.get(key)
        if entry is None:
            with self._kernels_lock:
                entry = self._kernels.get(key)
                if entry is None:
                    entry = (_cl().Kernel(program, name), threading.Lock())
                    self._kernels[key] = entry
        return entry

    def launch(self, program, name: str, global_size: tuple, local_size: tuple | None, *args) -> None:
        """Set the arguments of kernel ``name`` and enqueue it, atomically.

        Arguments are ``pyopencl.array.Array`` (passed as their buffer; one with a nonzero ``offset`` as a
        sub-buffer), numpy scalars
        (``np.int32(...)``, ``np.float32(...)``), ``cl.LocalMemory`` or raw buffers. An
        sub-buffer is allowed only at offsets aligned to the
        device's ``mem_base_addr_align``: kernels of this package return offset-free
        arrays, and a kernel taking views should pass the offset itself as an argument.
        A zero-size ``global_size`` launches nothing.
        """
        if any(int(g) == 0 for g in global_size):
            return
        kernel, lock = self._kernel(program, name)
        cargs = [_kernel_arg(a) for a in args]
        with lock:
            kernel.set_args(*cargs)
            _cl().enqueue_nd_range_kernel(self.queue, kernel, tuple(int(g) for g in global_size),
                                          None if local_size is None else tuple(int(s) for s in local_size))
        self.launches.add()

    # -- memory ---------------------------------------------------------------------
    def _allocate(self, nbytes: int):
        with self._pool_lock:
            if self.memory_limit and self._pool.active_bytes + nbytes > self.memory_limit:
                self._pool.free_held()
                raise Fail(
                    f"OpenCL memory limit exceeded on {self.device_name}: allocating {nbytes} bytes with "
                    f"{self._pool.active_bytes} in use would pass the limit of {self.memory_limit} bytes"
                )
            return self._pool.allocate(nbytes)

    @property
    def bytes_in_use(self) -> int:
        """Bytes of pooled buffers currently handed out."""
        return int(self._pool.active_bytes)

    def empty(self, shape, dtype) -> Any:
        """An uninitialized device array from the pool.

        :raises Fail: the allocation would pass the memory limit.
        """
        import pyopencl.array as cl_array

        return cl_array.Array(self.queue, tuple(int(s) for s in shape), np.dtype(dtype), allocator=self._allocate)

    def zeros(self, shape, dtype) -> Any:
        """A zero-filled device array from the pool."""
        a = self.empty(shape, dtype)
        if a.size:
            a.fill(0)
        return a

    def to_device(self, a: np.ndarray) -> Any:
        """Copy a host array to a new device array (non-blocking; the host array is copied first)."""
        a = np.asarray(a)
        if not a.flags.c_contiguous:
            a = a.copy()  # ascontiguousarray would turn a 0-d array into 1-d
        out = self.empty(a.shape, a.dtype)
        if a.size:
            # a blocking copy: the caller may reuse or free ``a`` at once
            _cl().enqueue_copy(self.queue, out.base_data, a, dst_offset=out.offset, is_blocking=True)
        return out

    def to_host(self, a) -> np.ndarray:
        """Copy a device array to a new host numpy array (waits for the queue)."""
        if a.size == 0:
            return np.empty(a.shape, a.dtype)
        return a.get(queue=self.queue)

    def synchronize(self) -> None:
        """Wait for every enqueued command."""
        self.queue.finish()


def _kernel_arg(a):
    from pyopencl.array import Array

    if isinstance(a, Array):
        if a.offset == 0:
            return a.base_data
        return a.base_data.get_sub_region(a.offset, a.nbytes)
    return a


_runtimes: dict[tuple, CLRuntime] = {}
_runtimes_lock = threading.Lock()


def get_runtime(platform=None, device=None, memory_limit: int = 0) -> CLRuntime:
    """The shared :class:`CLRuntime` for a device selection (see :func:`select_device`)."""
    key = (platform, device, int(memory_limit))
    rt = _runtimes.get(key)
    if rt is not None:
        return rt
    with _runtimes_lock:
        rt = _runtimes.get(key)
        if rt is None:
            dev = select_device(platform, device)
            # sessions on one device with one limit share a runtime whatever selector named it
            for other in _runtimes.values():
                if other.device == dev and other.memory_limit == int(memory_limit):
                    rt = other
                    break
            else:
                rt = CLRuntime(dev, memory_limit)
            _runtimes[key] = rt
    return rt


def probe(rt: CLRuntime) -> str | None:
    """Build and run a trivial kernel; ``None`` if it worked, else the reason."""
    try:
        prg = rt.program(_TRIVIAL_KERNEL)
        x = rt.to_device(np.zeros(4, np.float32))
        rt.launch(prg, "onnxrt_probe", (4,), None, x)
        got = rt.to_host(x)
    except Exception as e:  # noqa: BLE001 - any failure makes the device unusable
        return f"the device {rt.device_name!r} cannot run a trivial kernel: {type(e).__name__}: {e}"
    if not np.array_equal(got, np.ones(4, np.float32)):
        return f"the device {rt.device_name!r} computed a trivial kernel wrongly: {got}"
    return None
