"""A stand-in for the slice of CuPy the provider uses, backed by numpy (for tests without a GPU).

Device arrays are :class:`DeviceArray`, a numpy subclass, so code that leaks them to the
host or mixes them up is visible; streams, devices and allocators are context managers
that record their use. ``ElementwiseKernel`` keeps the generated source and runs the
chain it was generated from with numpy (the source itself is tested in
``test_codegen.py``).
"""

from __future__ import annotations

import threading
import types

import numpy as np
from onnxrt_cuda.codegen import EwProgram


class DeviceArray(np.ndarray):
    """An array 'on GPU 0'."""

    @property
    def device(self):
        return types.SimpleNamespace(id=0)

    def get(self, stream=None):
        return np.array(self)


def asarray(a, dtype=None):
    return np.asarray(a, dtype=dtype).view(DeviceArray)


def asnumpy(a, stream=None):
    return np.array(a)


class _Ctx:
    log: list = []

    def __init__(self, kind, *args):
        self.kind = kind
        self.args = args

    def __enter__(self):
        _Ctx.log.append((self.kind, threading.get_ident()))
        return self

    def __exit__(self, *exc):
        return False


class Stream(_Ctx):
    def __init__(self, non_blocking=False):
        super().__init__("stream")
        self.non_blocking = non_blocking
        self.synced = 0

    def synchronize(self):
        self.synced += 1


class MemoryPool:
    def __init__(self):
        self.limit = None
        self.requests: list[int] = []

    def set_limit(self, size=None):
        self.limit = size

    def malloc(self, n):
        self.requests.append(n)
        return n


#: every generated kernel: (in_params, out_params, body, name)
SOURCES: list[tuple] = []
_programs: dict[str, EwProgram] = {}


class ElementwiseKernel:
    def __init__(self, in_params, out_params, body, name, return_tuple=False):
        SOURCES.append((in_params, out_params, body, name))
        self.program = _programs[body]

    def __call__(self, *arrays):
        return tuple(asarray(v) for v in self.program.evaluate(np, [np.asarray(a) for a in arrays]))


def remember(program: EwProgram, dtypes) -> None:
    """Let :class:`ElementwiseKernel` find the chain a body was generated from."""
    _programs[program.source(list(dtypes))[2]] = program


def module():
    """A ``cupy``-like namespace: numpy's functions, device arrays, and the CUDA pieces."""
    ns = types.SimpleNamespace()
    for name in dir(np):
        if not name.startswith("_"):
            setattr(ns, name, getattr(np, name))
    ns.ndarray = DeviceArray
    ns.asarray = asarray
    ns.asnumpy = asnumpy
    ns.ElementwiseKernel = ElementwiseKernel
    rt = types.SimpleNamespace(getDeviceCount=lambda: 1, driverGetVersion=lambda: 13000,
                               runtimeGetVersion=lambda: 13000)
    ns.cuda = types.SimpleNamespace(runtime=rt, Device=lambda i=0: _Ctx("device", i), Stream=Stream,
                                    MemoryPool=MemoryPool, using_allocator=lambda a=None: _Ctx("allocator", a))
    return ns
