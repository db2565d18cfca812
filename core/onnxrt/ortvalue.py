"""``OrtValue`` and ``IOBinding``: values that may live on a device.

On the CPU an ``OrtValue`` wraps a numpy array. Device providers (CUDA) extend
``from_device``/``to_host`` through their ``Device``; the host path here needs none.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .dtypes import onnx_elem_type, type_string
from .errors import InvalidArgument

__all__ = ["OrtValue", "IOBinding", "get_device"]


def get_device() -> str:
    """``"CPU"``, or ``"GPU"`` when a GPU provider is available (onnxruntime's convention)."""
    from .plugins import get_available_providers

    avail = get_available_providers()
    return "GPU" if any(p.startswith("CUDA") for p in avail) else "CPU"


class OrtValue:
    """A value (tensor, sequence, map or None) with the device it lives on."""

    def __init__(self, value: Any, device_type: str = "cpu", device_id: int = 0):
        self._value = value
        self._device = (device_type.lower(), device_id)

    @classmethod
    def ortvalue_from_numpy(cls, array, device_type: str = "cpu", device_id: int = 0) -> "OrtValue":
        """Wrap a numpy array (the host is the only device the core knows)."""
        if device_type.lower() != "cpu":
            raise InvalidArgument(
                f"device {device_type!r} needs its provider's OrtValue support; the core only keeps host arrays"
            )
        return cls(np.asarray(array), "cpu", device_id)

    @classmethod
    def ortvalue_from_shape_and_type(cls, shape, element_type=np.float32, device_type: str = "cpu", device_id: int = 0):
        """A new uninitialized host tensor."""
        return cls.ortvalue_from_numpy(np.empty(shape, dtype=element_type), device_type, device_id)

    def numpy(self) -> Any:
        """The value as a host numpy array (or list/None for non-tensors)."""
        return self._value

    def data_ptr(self) -> int:
        """The address of the tensor's data."""
        return self._value.ctypes.data if isinstance(self._value, np.ndarray) else 0

    def device_name(self) -> str:
        """``"cpu"``, ``"cuda"``..."""
        return self._device[0]

    def shape(self) -> list[int]:
        """The tensor's shape."""
        return list(np.shape(self._value))

    def data_type(self) -> str:
        """onnxruntime's type string, e.g. ``tensor(float)``."""
        if isinstance(self._value, np.ndarray):
            return type_string(onnx_elem_type(self._value.dtype))
        if isinstance(self._value, list):
            return "seq"
        return "unknown"

    def element_type(self):
        """The numpy dtype of a tensor."""
        return self._value.dtype.type

    def is_tensor(self) -> bool:
        """Whether the value is a tensor."""
        return isinstance(self._value, np.ndarray)

    def has_value(self) -> bool:
        """False for an absent optional."""
        return self._value is not None

    def __repr__(self) -> str:
        return f"OrtValue({self.data_type()}, shape={self.shape()}, device={self._device[0]})"


class IOBinding:
    """Binds inputs and outputs by name, then runs with ``session.run_with_iobinding``."""

    def __init__(self, session):
        self._session = session
        self._inputs: dict[str, Any] = {}
        self._output_names: list[str] = []
        self._outputs: list[OrtValue] = []

    def bind_cpu_input(self, name: str, arr) -> None:
        """Bind a host array as input ``name``."""
        self._inputs[name] = np.asarray(arr)

    def bind_input(self, name: str, device_type="cpu", device_id=0, element_type=None, shape=None,
                   buffer_ptr=None) -> None:
        """Bind raw memory as an input (host arrays only in the core)."""
        raise InvalidArgument("bind_input with a raw pointer needs a device provider; use bind_cpu_input or bind_ortvalue_input")

    def bind_ortvalue_input(self, name: str, ortvalue: OrtValue) -> None:
        """Bind an ``OrtValue`` as input ``name``."""
        self._inputs[name] = ortvalue.numpy()

    def bind_output(self, name: str, device_type: str = "cpu", device_id: int = 0, element_type=None,
                    shape=None, buffer_ptr=None) -> None:
        """Ask for output ``name`` (allocated by the run)."""
        self._output_names.append(name)

    def bind_ortvalue_output(self, name: str, ortvalue: OrtValue) -> None:
        """Ask for output ``name`` into ``ortvalue``'s device."""
        self._output_names.append(name)

    def clear_binding_inputs(self) -> None:
        """Forget the bound inputs."""
        self._inputs.clear()

    def clear_binding_outputs(self) -> None:
        """Forget the bound outputs."""
        self._output_names.clear()
        self._outputs = []

    def synchronize_inputs(self) -> None:
        """No-op on the host."""

    def synchronize_outputs(self) -> None:
        """No-op on the host."""

    def _run(self, run_options) -> None:
        names = self._output_names or None
        outs = self._session.run(names, self._inputs, run_options)
        self._outputs = [OrtValue(v) for v in outs]

    def get_outputs(self) -> list[OrtValue]:
        """The outputs of the last run, as ``OrtValue``s."""
        return list(self._outputs)

    def copy_outputs_to_cpu(self) -> list:
        """The outputs of the last run as host arrays."""
        return [o.numpy() for o in self._outputs]
