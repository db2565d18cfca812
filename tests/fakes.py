"""A fake device provider for partitioner, copy and plugin tests (no hardware needed).

Its "device" wraps arrays in :class:`FakeArray`, so any value that reaches a kernel
of another provider without a copy step fails loudly. It runs Relu and Add, and
counts the copies made in each direction.
"""

import threading

import numpy as np

from onnxrt import hookimpl
from onnxrt.plugin.kernel import Kernel, KernelRegistry
from onnxrt.plugin.provider import Device, ExecutionProvider


class FakeArray:
    """An array 'on the fake device'."""

    def __init__(self, a):
        self.a = a

    @property
    def shape(self):
        return self.a.shape

    @property
    def dtype(self):
        return self.a.dtype


class FakeDevice(Device):
    kind = "fake"
    to_host_count = 0
    from_host_count = 0
    _lock = threading.Lock()

    def holds(self, value):
        return isinstance(value, FakeArray)

    def to_host(self, value):
        assert isinstance(value, FakeArray), f"to_host got {type(value).__name__}"
        with self._lock:
            FakeDevice.to_host_count += 1
        return value.a.copy()

    def from_host(self, value):
        assert isinstance(value, np.ndarray), f"from_host got {type(value).__name__}"
        with self._lock:
            FakeDevice.from_host_count += 1
        return FakeArray(value.copy())


def _registry():
    reg = KernelRegistry()

    @reg.op("Relu", since=1)
    class Relu(Kernel):
        def run(self, x):
            return (FakeArray(np.maximum(x.a, 0)),)

    @reg.op("Add", since=1)
    class Add(Kernel):
        def run(self, a, b):
            return (FakeArray(a.a + b.a),)

    return reg


class FakeDeviceProvider(ExecutionProvider):
    """Runs Relu and Add on a fake device."""

    name = "FakeDeviceExecutionProvider"
    aliases = ("fake",)
    priority = 50
    option_types = {"device_id": int}

    @classmethod
    def build_registry(cls):
        return _registry()

    def create_device(self):
        return FakeDevice()


@hookimpl
def onnxrt_register_providers(registry):
    registry.add_provider(FakeDeviceProvider)
