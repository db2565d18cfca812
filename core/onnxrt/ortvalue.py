"""``OrtValue`` and ``IOBinding``: values that may live on a device.

An ``OrtValue`` holds a host numpy array or a device array together with the
:class:`~onnxrt.plugin.provider.Device` it lives on. Device values come from a provider
(``OrtValue.ortvalue_from_numpy(a, "cuda", 0)`` uploads through the provider whose
device kind is ``"cuda"``) or wrap an existing device array with no copy
(:meth:`OrtValue.from_device_array`, :meth:`OrtValue.from_dlpack`).

``IOBinding`` runs a session with bound values. A device-resident input reaches the
kernels of the provider on that device without passing through the host, and an
output bound to a device stays there: the session's plan is specialised per binding
signature, dropping the copy steps that would move those values to and from the host.
"""

from __future__ import annotations

import ctypes
import dataclasses
import math
import threading
import weakref
from typing import Any

import numpy as np

from .dtypes import np_dtype, onnx_elem_type, type_string
from .errors import EPFail, Fail, InvalidArgument

__all__ = ["IOBinding", "OrtValue", "device_for", "get_device"]


def get_device() -> str:
    """``"CPU"``, or ``"GPU"`` when a GPU provider is available (onnxruntime's convention)."""
    from .plugin.discovery import get_available_providers

    avail = get_available_providers()
    return "GPU" if any(p.startswith("CUDA") for p in avail) else "CPU"


# -- finding a device by kind ------------------------------------------------------------------

_devices: dict[tuple[str, int], Any] = {}
_devices_lock = threading.Lock()


def device_for(device_type: str, device_id: int = 0, session=None):
    """The :class:`~onnxrt.plugin.provider.Device` for ``device_type``/``device_id``.

    A session's own provider devices come first (they share its memory pool and
    streams); otherwise the installed provider whose alias is ``device_type`` makes one.
    """
    from .plugin.provider import HostDevice

    device_type, device_id = _device_kind(device_type, device_id)
    kind = device_type
    if kind == "cpu":
        return HostDevice()
    if session is not None:
        for p in session._built.providers:
            if p.device.kind == kind and p.device.device_id == device_id:
                return p.device
    with _devices_lock:
        dev = _devices.get((kind, device_id))
        if dev is not None:
            return dev
        from .plugin.discovery import _availability, provider_registry

        for cls in provider_registry().classes():
            if kind not in [a.lower() for a in cls.aliases]:
                continue
            why = _availability(cls)
            if why is not None:
                raise EPFail(f"device {kind!r} needs {cls.name}, which is not available: {why}")
            opts = {"device_id": device_id} if "device_id" in cls.option_types else {}
            dev = cls(opts).device
            _devices[(kind, device_id)] = dev
            return dev
    raise InvalidArgument(f"no installed provider has a {kind!r} device (install its onnxrt provider package)")


def _device_kind(device_type, device_id: int = 0) -> tuple[str, int]:
    """``(kind, index)`` from a device name (``"cuda"``) or an :class:`~onnxrt.devices.OrtDevice`."""
    from .devices import OrtDevice

    if isinstance(device_type, OrtDevice):
        return device_type.name, device_type.device_id()
    return str(device_type).lower(), int(device_id)


def _same_device(a, b) -> bool:
    return a is b or (a.kind == b.kind and a.device_id == b.device_id)


class OrtValue:
    """A value (tensor, sequence, map or None) with the device it lives on."""

    def __init__(self, value: Any, device_type: str = "cpu", device_id: int = 0, device=None):
        self._value = value
        self._device = _device_kind(device_type, device_id)
        self._dev = device

    @property
    def device(self):
        """The :class:`~onnxrt.plugin.provider.Device` holding the value."""
        if self._dev is None:
            self._dev = device_for(*self._device)
        return self._dev

    @classmethod
    def ortvalue_from_numpy(cls, array, device_type: str = "cpu", device_id: int = 0) -> OrtValue:
        """A value on ``device_type`` (a name or an ``OrtDevice``): host arrays are copied
        there through its provider."""
        kind, device_id = _device_kind(device_type, device_id)
        if kind == "cpu":
            return cls(np.asarray(array), "cpu", device_id)
        dev = device_for(kind, device_id)
        if _holds(dev, array):
            return cls(array, kind, device_id, dev)
        return cls(dev.from_host(np.asarray(array)), kind, device_id, dev)

    @classmethod
    def from_device_array(cls, array, device_type: str = "cuda", device_id: int | None = None) -> OrtValue:
        """Wrap an array already on a device (a CuPy array, or anything with
        ``__cuda_array_interface__`` or DLPack) with no copy."""
        if device_id is None:
            d = getattr(array, "device", None)
            device_id = int(getattr(d, "id", 0) or 0)
        dev = device_for(device_type, device_id)
        if _holds(dev, array):
            return cls(array, device_type, device_id, dev)
        wrap = getattr(dev, "wrap", None)
        if wrap is None:
            raise InvalidArgument(f"the {device_type!r} device cannot wrap a {type(array).__name__}")
        return cls(wrap(array), device_type, device_id, dev)

    @classmethod
    def from_dlpack(cls, data, device_type: str | None = None, device_id: int | None = None) -> OrtValue:
        """Wrap a DLPack tensor with no copy: an object with ``__dlpack__`` (a numpy or CuPy
        array, another ``OrtValue``) or a DLPack capsule. The device is read from the tensor
        itself (``__dlpack_device__`` or the capsule's DLTensor); ``device_type`` and
        ``device_id`` override it."""
        if isinstance(data, OrtValue):
            data = data._value if isinstance(data._value, np.ndarray) else data
        if isinstance(data, np.ndarray):
            return cls(data)
        if _is_capsule(data):
            kind, dev_id = _capsule_device(data)
            data = _CapsuleHolder(data, (_DL_CODE_BY_KIND.get(kind, 1), dev_id))
        elif hasattr(data, "__dlpack_device__"):
            code, dev_id = data.__dlpack_device__()
            kind = _DL_KIND_BY_CODE.get(int(code))
            if kind is None:
                raise InvalidArgument(f"DLPack device type {int(code)} has no onnxrt device")
        else:
            raise InvalidArgument(f"from_dlpack expects a DLPack capsule or an object with __dlpack__, "
                                  f"got {type(data).__name__}")
        kind = (device_type or kind).lower()
        dev_id = int(dev_id if device_id is None else device_id)
        if kind == "cpu":
            return cls(np.from_dlpack(data))
        return cls.from_device_array(data, kind, dev_id)

    @classmethod
    def ortvalue_from_numpy_with_onnx_type(cls, data, onnx_element_type: int) -> OrtValue:
        """A host value whose bytes are ``data``'s, typed as the ONNX element type
        ``onnx_element_type`` (for types numpy lacks: bfloat16, float8, int4...)."""
        try:
            want = np_dtype(int(onnx_element_type))
        except TypeError:
            raise InvalidArgument(f"unknown ONNX element type {onnx_element_type!r}") from None
        a = np.ascontiguousarray(data)
        if a.dtype == want:
            return cls(a)
        if a.dtype.itemsize != want.itemsize:
            raise InvalidArgument(f"a {a.dtype} array cannot hold ONNX element type {int(onnx_element_type)} "
                                  f"({want}): the element sizes differ")
        return cls(a.view(want))

    @classmethod
    def ort_value_from_sparse_tensor(cls, sparse_tensor) -> OrtValue:
        """An ``OrtValue`` holding a :class:`~onnxrt.sparse.SparseTensor`."""
        from .sparse import SparseTensor

        if not isinstance(sparse_tensor, SparseTensor):
            raise InvalidArgument(f"expected a SparseTensor, got {type(sparse_tensor).__name__}")
        return cls(sparse_tensor)

    def as_sparse_tensor(self):
        """The :class:`~onnxrt.sparse.SparseTensor` this value holds."""
        if not self.is_sparse_tensor():
            raise InvalidArgument(f"this OrtValue holds {self.data_type()}, not a sparse tensor")
        return self._value

    def is_sparse_tensor(self) -> bool:
        """Whether the value is a sparse tensor."""
        from .sparse import SparseTensor

        return isinstance(self._value, SparseTensor)

    def is_tensor_sequence(self) -> bool:
        """Whether the value is a sequence of tensors."""
        return isinstance(self._value, list)

    @classmethod
    def ortvalue_from_shape_and_type(cls, shape, element_type=np.float32, device_type: str = "cpu", device_id: int = 0):
        """A new tensor of ``shape`` (zeros on a device, uninitialized on the host);
        ``element_type`` is a numpy dtype or an ONNX element type number."""
        element_type = _element_dtype(element_type)
        device_type, device_id = _device_kind(device_type, device_id)
        if device_type == "cpu":
            return cls(np.empty(shape, dtype=element_type), "cpu", device_id)
        return cls.ortvalue_from_numpy(np.zeros(shape, dtype=element_type), device_type, device_id)

    def numpy(self) -> Any:
        """The value as a host numpy array (copied from its device; lists/None as they are)."""
        if self._device[0] == "cpu" or isinstance(self._value, np.ndarray) or self._value is None:
            return self._value
        return self.device.to_host(self._value)

    def device_array(self) -> Any:
        """The underlying array, on its device (a numpy array for the host), with no copy."""
        return self._value

    def data_ptr(self) -> int:
        """The address of the tensor's data (device memory for device values)."""
        v = self._value
        if isinstance(v, np.ndarray):
            return v.ctypes.data
        cai = getattr(v, "__cuda_array_interface__", None)
        if cai is not None:
            return int(cai["data"][0])
        return 0

    def device_name(self) -> str:
        """``"cpu"``, ``"cuda"``..."""
        return self._device[0]

    def device_id(self) -> int:
        """The device index."""
        return self._device[1]

    def shape(self) -> list[int]:
        """The tensor's shape."""
        shp = getattr(self._value, "shape", None)
        return list(shp) if shp is not None else list(np.shape(self._value))

    def data_type(self) -> str:
        """onnxruntime's type string, e.g. ``tensor(float)``."""
        if self.is_sparse_tensor():
            return self._value.data_type()
        dt = getattr(self._value, "dtype", None)
        if dt is not None and not isinstance(self._value, (list, dict)):
            return type_string(onnx_elem_type(np.dtype(dt)))
        if isinstance(self._value, list):
            return "seq"
        return "unknown"

    def element_type(self) -> int:
        """The tensor's ONNX element type number (``TensorProto.FLOAT`` is 1), as onnxruntime returns it."""
        if not self.is_tensor():
            raise InvalidArgument(f"element_type() needs a tensor; this OrtValue holds {self.data_type()}")
        return onnx_elem_type(np.dtype(self._value.dtype))

    def tensor_size_in_bytes(self) -> int:
        """The bytes the tensor's elements take (strings: their UTF-8 bytes)."""
        if not self.is_tensor():
            raise InvalidArgument(f"tensor_size_in_bytes() needs a tensor; this OrtValue holds {self.data_type()}")
        v = self._value
        if np.dtype(v.dtype) == object:
            return sum(len(str(e).encode()) for e in np.asarray(v).reshape(-1))
        return int(math.prod(v.shape)) * np.dtype(v.dtype).itemsize

    def is_tensor(self) -> bool:
        """Whether the value is a (dense) tensor."""
        return hasattr(self._value, "dtype") and hasattr(self._value, "shape")

    def update_inplace(self, np_arr) -> None:
        """Copy ``np_arr`` (same shape and dtype) into this tensor's memory, on its device."""
        src = np.asarray(np_arr)
        v = self._value
        if not self.is_tensor() or tuple(src.shape) != tuple(v.shape) or src.dtype != np.dtype(v.dtype):
            raise InvalidArgument(f"update_inplace: a {src.dtype}{list(src.shape)} array does not fit "
                                  f"{self.data_type()} of shape {self.shape()}")
        if isinstance(v, np.ndarray):
            v[...] = src
        else:
            v[...] = self.device.from_host(src)

    # -- numpy's array protocol and DLPack ---------------------------------------------------
    def __array__(self, dtype=None, copy=None):
        """A host value as a numpy array with no copy (a copy for a device value, or a dtype change)."""
        a = self.numpy()
        if not isinstance(a, np.ndarray):
            raise InvalidArgument(f"this OrtValue holds {self.data_type()}, which is not an array")
        if dtype is not None and np.dtype(dtype) != a.dtype:
            if copy is False:
                raise ValueError("converting the OrtValue to another dtype needs a copy")
            return a.astype(dtype)
        return a.copy() if copy else a

    def __dlpack__(self, *args, **kwargs):
        """The tensor as a DLPack capsule (no copy), through its array's own ``__dlpack__``."""
        v = self._value
        if not hasattr(v, "__dlpack__"):
            raise InvalidArgument(f"this OrtValue holds a {type(v).__name__}, which has no DLPack export")
        return v.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        """``(DLPack device type, device id)``: ``(1, 0)`` for the host."""
        v = self._value
        if hasattr(v, "__dlpack_device__"):
            code, dev_id = v.__dlpack_device__()
            return int(code), int(dev_id)
        return _DL_CODE_BY_KIND.get(self._device[0], 1), self._device[1]

    def has_value(self) -> bool:
        """False for an absent optional."""
        return self._value is not None

    def __repr__(self) -> str:
        return f"OrtValue({self.data_type()}, shape={self.shape()}, device={self._device[0]})"


# DLPack's device type codes (dlpack.h) and onnxrt's device kinds
_DL_KIND_BY_CODE = {1: "cpu", 2: "cuda", 3: "cpu", 4: "opencl", 10: "rocm", 13: "cpu"}
_DL_CODE_BY_KIND = {"cpu": 1, "cuda": 2, "opencl": 4, "rocm": 10}


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLTensorHead(ctypes.Structure):
    # the start of DLTensor: enough to read where the data lives
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice)]


class _DLManagedTensorVersionedHead(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p), ("flags", ctypes.c_uint64), ("dl_tensor", _DLTensorHead)]


_capsule_api = ctypes.pythonapi
_capsule_api.PyCapsule_GetName.restype = ctypes.c_char_p
_capsule_api.PyCapsule_GetName.argtypes = [ctypes.py_object]
_capsule_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_capsule_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _is_capsule(obj) -> bool:
    return type(obj).__name__ == "PyCapsule"


def _capsule_device(capsule) -> tuple[str, int]:
    """The onnxrt device kind and index of an unconsumed DLPack capsule, read from its DLTensor."""
    name = _capsule_api.PyCapsule_GetName(capsule)
    if name not in (b"dltensor", b"dltensor_versioned"):
        raise InvalidArgument(f"not an unconsumed DLPack capsule (its name is {name!r})")
    ptr = _capsule_api.PyCapsule_GetPointer(capsule, name)
    if name == b"dltensor":  # DLManagedTensor starts with its DLTensor
        dev = _DLTensorHead.from_address(ptr).device
    else:
        dev = _DLManagedTensorVersionedHead.from_address(ptr).dl_tensor.device
    kind = _DL_KIND_BY_CODE.get(int(dev.device_type))
    if kind is None:
        raise InvalidArgument(f"DLPack device type {int(dev.device_type)} has no onnxrt device")
    return kind, int(dev.device_id)


class _CapsuleHolder:
    """A capsule presented through the DLPack protocol, for consumers that take objects."""

    def __init__(self, capsule, device: tuple[int, int]):
        self._capsule = capsule
        self._device = device

    def __dlpack__(self, *args, **kwargs):
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._device


def _element_dtype(element_type) -> np.dtype:
    """A numpy dtype from a numpy type or an ONNX element type number (``TensorProto.FLOAT``...)."""
    if isinstance(element_type, (int, np.integer)) and not isinstance(element_type, bool):
        try:
            return np_dtype(int(element_type))
        except TypeError:
            raise InvalidArgument(f"unknown ONNX element type {int(element_type)}") from None
    return np.dtype(element_type)


def _holds(dev, value) -> bool:
    holds = getattr(dev, "holds", None)
    if holds is not None:
        return bool(holds(value))
    return dev.is_host and isinstance(value, np.ndarray)


def _host_array_at(ptr: int, shape, dtype) -> np.ndarray:
    dt = np.dtype(dtype)
    n = math.prod(shape) * dt.itemsize
    buf = (ctypes.c_char * n).from_address(int(ptr))
    return np.frombuffer(buf, dtype=dt).reshape(shape)


class IOBinding:
    """Binds inputs and outputs by name, then runs with ``session.run_with_iobinding``."""

    def __init__(self, session):
        self._session = session
        self._inputs: dict[str, OrtValue] = {}
        self._outputs_wanted: dict[str, tuple[Any, Any]] = {}  # name -> (device, preallocated array or None)
        self._outputs: list[OrtValue] = []

    # -- inputs ------------------------------------------------------------------------------
    def bind_cpu_input(self, name: str, arr) -> None:
        """Bind a host array as input ``name``."""
        self._inputs[name] = OrtValue(np.asarray(arr))

    def bind_input(self, name: str, device_type="cpu", device_id=0, element_type=None, shape=None,
                   buffer_ptr=None) -> None:
        """Bind memory at ``buffer_ptr`` (``shape`` elements of ``element_type``) on a device."""
        if buffer_ptr is None or element_type is None or shape is None:
            raise InvalidArgument("bind_input needs element_type, shape and buffer_ptr; "
                                  "use bind_cpu_input or bind_ortvalue_input for arrays")
        self._inputs[name] = self._at(device_type, device_id, element_type, shape, buffer_ptr)

    def _at(self, device_type, device_id, element_type, shape, buffer_ptr) -> OrtValue:
        kind, device_id = _device_kind(device_type, device_id)
        shape = tuple(int(d) for d in shape)
        element_type = _element_dtype(element_type)
        if element_type == object or element_type.kind in "US":
            # raw memory holds no string objects: reading it as strings would read garbage
            raise Fail("Only binding non-string Tensors through bind_input/bind_output with a buffer pointer "
                       "is supported; bind string tensors with bind_cpu_input or bind_ortvalue_input")
        if kind == "cpu":
            return OrtValue(_host_array_at(buffer_ptr, shape, element_type))
        dev = device_for(kind, device_id, self._session)
        wrap = getattr(dev, "wrap_pointer", None)
        if wrap is None:
            raise InvalidArgument(f"the {kind!r} device cannot bind raw memory")
        return OrtValue(wrap(int(buffer_ptr), shape, np.dtype(element_type)), kind, device_id, dev)

    def bind_ortvalue_input(self, name: str, ortvalue: OrtValue) -> None:
        """Bind an ``OrtValue`` (on any device) as input ``name``."""
        if not isinstance(ortvalue, OrtValue):
            raise InvalidArgument(f"bind_ortvalue_input expects an OrtValue, got {type(ortvalue).__name__}")
        self._inputs[name] = ortvalue

    # -- outputs -----------------------------------------------------------------------------
    def bind_output(self, name: str, device_type: str = "cpu", device_id: int = 0, element_type=None,
                    shape=None, buffer_ptr=None) -> None:
        """Ask for output ``name`` on ``device_type``; with ``buffer_ptr`` it is written there."""
        pre = None
        if buffer_ptr is not None:
            if element_type is None or shape is None:
                raise InvalidArgument("bind_output with buffer_ptr needs element_type and shape")
            pre = self._at(device_type, device_id, element_type, shape, buffer_ptr)
        dev = device_for(device_type, device_id, self._session)
        self._outputs_wanted[name] = (dev, pre)

    def bind_ortvalue_output(self, name: str, ortvalue: OrtValue) -> None:
        """Write output ``name`` into ``ortvalue`` (same shape and type), on its device."""
        self._outputs_wanted[name] = (ortvalue.device, ortvalue)

    def clear_binding_inputs(self) -> None:
        """Forget the bound inputs."""
        self._inputs.clear()

    def clear_binding_outputs(self) -> None:
        """Forget the bound outputs."""
        self._outputs_wanted.clear()
        self._outputs = []

    def synchronize_inputs(self) -> None:
        """Wait until the bound device inputs are written."""
        for ov in self._inputs.values():
            if ov.device_name() != "cpu":
                ov.device.synchronize()

    def synchronize_outputs(self) -> None:
        """Wait until the outputs are written (runs already end synchronized)."""
        for ov in self._outputs:
            if ov.device_name() != "cpu":
                ov.device.synchronize()

    # -- running -----------------------------------------------------------------------------
    def _run(self, run_options) -> None:
        from .plan import RunContext

        sess = self._session
        built = sess._built
        host, on_device = {}, {}
        for n, ov in self._inputs.items():
            if ov.device_name() == "cpu":
                host[n] = ov.device_array()
            else:
                on_device[n] = ov
        from .plan import shape_stand_in

        # the feed checker reads shapes and dtypes only
        stand_ins = {n: shape_stand_in(ov.device_array()) for n, ov in on_device.items()}
        feeds = sess._checker.check({**host, **stand_ins})
        for n, ov in on_device.items():
            feeds[n] = ov.device_array()
        names = sess._resolve_outputs(list(self._outputs_wanted) or None)
        order = sess._output_names
        keep = {order.index(n): dev for n, (dev, _) in self._outputs_wanted.items() if not dev.is_host}
        plan = _specialized_plan(built.plan, {n: ov.device for n, ov in on_device.items()}, keep)
        ctx = None
        if run_options is not None or sess._profiler is not None:
            ctx = RunContext(run_options, sess._profiler)
        with sess._threads:
            outs = plan.run(feeds, None, ctx)
        by_name = dict(zip(order, outs))
        from .plan import array_root

        # host outputs that share memory with a feed or a constant are copied, as run() does
        protect = built.const_roots | {id(array_root(v)) for v in host.values() if isinstance(v, np.ndarray)}
        result = []
        for n in names:
            v = by_name[n]
            dev, pre = self._outputs_wanted.get(n, (None, None))
            result.append(_place(v, dev, pre, n, built, protect))
        for ov in result:
            if ov.device_name() != "cpu":
                ov.device.synchronize()
        self._outputs = result

    def get_outputs(self) -> list[OrtValue]:
        """The outputs of the last run, as ``OrtValue``s."""
        return list(self._outputs)

    def copy_outputs_to_cpu(self) -> list:
        """The outputs of the last run as host arrays (copied from their devices)."""
        return [o.numpy() for o in self._outputs]


def _place(v, dev, pre: OrtValue | None, name: str, built, protect: set) -> OrtValue:
    """The output value ``v`` as an ``OrtValue`` on ``dev`` (into ``pre`` when preallocated)."""
    if dev is None or dev.is_host:
        if isinstance(v, np.ndarray):
            from .plan import caller_owned

            v = caller_owned(v, protect)
        elif isinstance(v, list):  # a sequence: its tensors as the caller's own arrays
            v = [caller_owned(e, protect) if isinstance(e, np.ndarray) else e for e in v]
        elif v is not None and not isinstance(v, dict):
            v = _device_of(v, built).to_host(v)
        if pre is not None:
            dst = pre.device_array()
            if tuple(dst.shape) != tuple(np.shape(v)) or dst.dtype != v.dtype:
                raise InvalidArgument(f"output {name!r} is {v.dtype}{list(np.shape(v))} but the bound buffer is "
                                      f"{dst.dtype}{list(dst.shape)}")
            dst[...] = v
            return pre
        return OrtValue(v)
    if not _holds(dev, v):
        src = _device_of(v, built) if not isinstance(v, np.ndarray) else None
        v = dev.from_host(src.to_host(v) if src is not None else v)
    if pre is not None:
        dst = pre.device_array()
        if tuple(dst.shape) != tuple(v.shape) or dst.dtype != v.dtype:
            raise InvalidArgument(f"output {name!r} is {v.dtype}{list(v.shape)} but the bound buffer is "
                                  f"{dst.dtype}{list(dst.shape)}")
        dst[...] = v
        return pre
    return OrtValue(v, dev.kind, dev.device_id, dev)


def _device_of(v, built):
    for p in built.providers:
        if _holds(p.device, v):
            return p.device
    raise InvalidArgument(f"an output is a {type(v).__name__} that no provider of the session holds")


# -- plans specialised for device-resident inputs and outputs ------------------------------------

_plans: weakref.WeakKeyDictionary[Any, dict] = weakref.WeakKeyDictionary()
_plans_lock = threading.Lock()


def _specialized_plan(plan, feed_devices: dict[str, Any], keep_outputs: dict[int, Any]):
    """``plan`` without the copies that would move device feeds and kept outputs through the host."""
    if not feed_devices and not keep_outputs:
        return plan
    key = (tuple(sorted((n, d.kind, d.device_id) for n, d in feed_devices.items())),
           tuple(sorted((i, d.kind, d.device_id) for i, d in keep_outputs.items())))
    with _plans_lock:
        cache = _plans.setdefault(plan, {})
        hit = cache.get(key)
        if hit is None:
            hit = cache[key] = _specialize(plan, feed_devices, keep_outputs)
        return hit


def _specialize(plan, feed_devices, keep_outputs):
    from .plan import Plan, Step, _copy_fn, reads_shape_only, shape_step

    steps = list(plan.steps)
    readers: dict[int, list[int]] = {}
    for k, st in enumerate(steps):
        for s in st.ins:
            readers.setdefault(s, []).append(k)
        for _, s in st.implicit:
            readers.setdefault(s, []).append(k)
    drop: set[int] = set()
    first: list = []
    input_slots = dict(plan.input_slots)
    n_slots = plan.n_slots
    for name, dev in feed_devices.items():
        slot = plan.input_slots[name]
        ups = [k for k in readers.get(slot, []) if steps[k].is_copy and steps[k].dst_device is not None
               and _same_device(steps[k].dst_device, dev)]
        if ups:
            target = steps[ups[0]].outs[0]
            drop.update(ups)
        else:
            target = n_slots
            n_slots += 1
        input_slots[name] = target
        others = [steps[k] for k in readers.get(slot, []) if k not in drop]
        if others and all(st.host and reads_shape_only(st.op_type, st.domain) and st.ins[0] == slot
                          and slot not in st.ins[1:] for st in others):
            # only host Shape/Size read it: they get its shape, not a copy of its data
            first.append(shape_step(target, slot, name, dev))
        elif others:
            # host kernels (or another device) read the input too: they get one host copy
            first.append(Step(_copy_fn(dev.to_host), (target,), (slot,), (), f"copy:{name}", "MemcpyToHost",
                              f"{dev.kind}->cpu", is_copy=True, output_names=(name,), src_device=dev))
    output_slots = list(plan.output_slots)
    for i, dev in keep_outputs.items():
        s = output_slots[i]
        for k, st in enumerate(steps):
            if (st.is_copy and st.outs == (s,) and st.src_device is not None and _same_device(st.src_device, dev)
                    and not readers.get(s) and output_slots.count(s) == 1):
                drop.add(k)
                output_slots[i] = st.ins[0]
                break
    kept = first + [st for k, st in enumerate(steps) if k not in drop]
    constants = {s: plan._template[s] for s in plan._const_slots}
    keep = set(output_slots) | set(constants) | {0}
    last: dict[int, int] = {}
    for idx, st in enumerate(kept):
        for s in list(st.ins) + [s for _, s in st.implicit] + list(st.outs):
            last[s] = idx
    frees: list[list[int]] = [[] for _ in kept]
    for s, idx in last.items():
        if s not in keep:
            frees[idx].append(s)
    kept = [dataclasses.replace(st, free=tuple(sorted(fr))) for st, fr in zip(kept, frees)]
    return Plan(kept, n_slots, input_slots, plan.outer_slots, output_slots, constants, plan.max_bytes,
                scopes=plan.scopes)
