"""A stand-in for the slice of CuPy the provider uses, backed by numpy (for tests without a GPU).

Device arrays are :class:`DeviceArray`, a numpy subclass, so code that leaks them to the
host or mixes them up is visible; streams, devices and allocators are context managers
that record their use. ``ElementwiseKernel`` keeps the generated source and runs the
chain it was generated from with numpy (the source itself is tested in
``test_codegen.py``); ``RawModule`` runs ``onnxrt_cuda.raw``'s kernels the same way.
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


class Device(_Ctx):
    def __init__(self, i=0):
        super().__init__("device", i)
        self.id = i


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


class RawModule:
    """``onnxrt_cuda.raw``'s kernels as their contract says, in numpy: the launch's
    arguments in, the output buffers written (the grid is ignored). float16 is
    accumulated in float32, as the CUDA source does; the source itself is compiled by
    ``nvcc`` in ``test_codegen.py``."""

    def __init__(self, code, options=()):
        self.options = tuple(options)

    def get_function(self, name):
        return getattr(self, "_" + name.removeprefix("onnxrt_"))

    @staticmethod
    def _acc(a):
        return np.float32 if a.dtype == np.float16 else a.dtype.type

    @staticmethod
    def _im2col(grid, block, args):
        x, cols, c, h, w, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw, nb, ones, flat = args
        x = np.asarray(x)[:nb]
        ih = (np.arange(oh) * sh - ph)[None, :, None, None] + (np.arange(kh) * dh)[:, None, None, None]
        iw = (np.arange(ow) * sw - pw)[None, None, None, :] + (np.arange(kw) * dw)[None, None, :, None]
        inside = (ih >= 0) & (ih < h) & (iw >= 0) & (iw < w)  # [kh, oh, kw, ow]
        taps = x[:, :, np.clip(ih, 0, h - 1), np.clip(iw, 0, w - 1)] * inside  # [nb, c, kh, oh, kw, ow]
        vals = taps.transpose(0, 1, 2, 4, 3, 5).reshape(nb, c * kh * kw, oh * ow).astype(x.dtype)
        if ones:
            vals = np.concatenate([vals, np.ones((nb, 1, oh * ow), x.dtype)], axis=1)
        dst = np.asarray(cols).reshape(-1)[: vals.size]
        if flat:
            dst.reshape(vals.shape[1], nb, oh * ow)[...] = vals.transpose(1, 0, 2)
        else:
            dst.reshape(vals.shape)[...] = vals

    @classmethod
    def _layer_norm(cls, grid, block, args):
        x, scale, bias, y, mean_out, inv_out, rows, d, eps, has_bias = args
        acc = cls._acc(x)
        xr = np.asarray(x).reshape(rows, d).astype(acc)
        mean = xr.sum(axis=1, dtype=acc) / acc(d)
        dev = xr - mean[:, None]
        inv = acc(1) / np.sqrt((dev * dev).sum(axis=1, dtype=acc) / acc(d) + eps)
        v = dev * inv[:, None] * np.asarray(scale).astype(acc)
        if has_bias:
            v = v + np.asarray(bias).astype(acc)
        np.asarray(y).reshape(rows, d)[...] = v
        np.asarray(mean_out)[...] = mean
        np.asarray(inv_out)[...] = inv

    @classmethod
    def _softmax(cls, grid, block, args):
        x, y, rows, d, log_out, lowest = args
        acc = cls._acc(x)
        xr = np.asarray(x).reshape(rows, d).astype(acc)
        z = xr - xr.max(axis=1, keepdims=True)
        s = np.exp(z).sum(axis=1, keepdims=True)
        np.asarray(y).reshape(rows, d)[...] = z - np.log(s) if log_out else np.exp(z) / s


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
    ns.RawModule = RawModule
    rt = types.SimpleNamespace(getDeviceCount=lambda: 1, driverGetVersion=lambda: 13000,
                               runtimeGetVersion=lambda: 13000)
    ns.cuda = types.SimpleNamespace(runtime=rt, Device=Device, Stream=Stream,
                                    MemoryPool=MemoryPool, using_allocator=lambda a=None: _Ctx("allocator", a))
    return ns
