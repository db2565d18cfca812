"""Devices, memory descriptions and arena settings, named and numbered as onnxruntime's.

``OrtDevice``, ``OrtMemoryInfo`` and ``OrtArenaCfg`` describe where a value lives and how
an allocator would be set up. onnxrt allocates host memory through numpy and device
memory through each provider, so these objects are descriptions: they carry onnxruntime's
numbers (device types, vendor ids, memory types) so that code which builds or compares
them keeps working, and :func:`create_and_register_allocator` records a shared allocator
description that sessions asking for ``session.use_env_allocators`` can look up.
"""

from __future__ import annotations

import enum
import threading
from typing import Any

from .errors import InvalidArgument

__all__ = [
    "OrtDevice",
    "OrtDeviceVendorId",
    "OrtDeviceMemoryType",
    "OrtMemoryInfo",
    "OrtMemoryInfoDeviceType",
    "OrtAllocatorType",
    "OrtMemType",
    "OrtArenaCfg",
    "create_and_register_allocator",
    "create_and_register_allocator_v2",
    "registered_allocators",
]


class OrtDeviceVendorId(enum.IntEnum):
    """PCI vendor ids onnxruntime uses for devices."""

    NONE = 0
    AMD = 0x1002
    NVIDIA = 0x10DE
    ARM = 0x13B5
    MICROSOFT = 0x1414
    HUAWEI = 0x19E5
    QUALCOMM = 0x5143
    INTEL = 0x8086


class OrtDeviceMemoryType(enum.IntEnum):
    """A device's memory kind: its own, or memory the host can also reach."""

    DEFAULT = 0
    HOST_ACCESSIBLE = 5


class OrtMemoryInfoDeviceType(enum.IntEnum):
    """The device kinds ``OrtMemoryInfo.create_v2`` takes."""

    CPU = 0
    GPU = 1
    FPGA = 2
    NPU = 3


class OrtAllocatorType(enum.IntEnum):
    """A plain device allocator or an arena over it."""

    INVALID = -1
    ORT_DEVICE_ALLOCATOR = 0
    ORT_ARENA_ALLOCATOR = 1


class OrtMemType(enum.IntEnum):
    """Where a kernel wants a value: the device's default memory or host memory beside it."""

    CPU_INPUT = -2
    CPU_OUTPUT = -1
    CPU = -1
    DEFAULT = 0


# onnxruntime's OrtDevice type numbers, and the device kinds onnxrt's providers use
_TYPES = {"cpu": 0, "cuda": 1, "gpu": 1, "fpga": 2, "npu": 3, "dml": 4, "cann": 3, "webgpu": 1, "opencl": 1}
_VENDORS = {"cuda": OrtDeviceVendorId.NVIDIA, "dml": OrtDeviceVendorId.MICROSOFT,
            "cann": OrtDeviceVendorId.HUAWEI, "opencl": OrtDeviceVendorId.NONE}


class OrtDevice:
    """A device: its type number, vendor id, memory type and index, as onnxruntime numbers them.

    ``OrtDevice.make("cpu", 0)`` and ``OrtDevice.make("cuda", 0)`` build one from a device
    name; the class methods ``cpu()``, ``cuda()``... give the type numbers.
    """

    def __init__(self, device_type: int = 0, mem_type: int = 0, vendor_id: int = 0, device_id: int = 0,
                 name: str = "cpu"):
        self._type = int(device_type)
        self._mem = int(mem_type)
        self._vendor = int(vendor_id)
        self._id = int(device_id)
        self._name = name

    @classmethod
    def make(cls, ort_device_name: str, device_id: int) -> OrtDevice:
        """The device called ``ort_device_name`` (``cpu``, ``cuda``, ``dml``, ``cann``, ``opencl``...)."""
        name = str(ort_device_name).lower()
        if name not in _TYPES:
            raise InvalidArgument(f"unsupported device name {ort_device_name!r}; known: {', '.join(sorted(_TYPES))}")
        if not isinstance(device_id, int) or device_id < 0:
            raise InvalidArgument(f"device_id must be a non-negative int, not {device_id!r}")
        vendor = _VENDORS.get(name, OrtDeviceVendorId.NONE)
        return cls(_TYPES[name], OrtDeviceMemoryType.DEFAULT, vendor, device_id, name)

    # the type and memory numbers, as onnxruntime's C-level OrtDevice exposes them
    @staticmethod
    def cpu() -> int:
        """The CPU type number (0)."""
        return 0

    @staticmethod
    def cuda() -> int:
        """The GPU type number (1), which CUDA devices use."""
        return 1

    @staticmethod
    def gpu() -> int:
        """The GPU type number (1)."""
        return 1

    @staticmethod
    def fpga() -> int:
        """The FPGA type number (2)."""
        return 2

    @staticmethod
    def npu() -> int:
        """The NPU type number (3)."""
        return 3

    @staticmethod
    def dml() -> int:
        """The DirectML type number (4)."""
        return 4

    @staticmethod
    def default_memory() -> int:
        """The default memory type (0)."""
        return 0

    def device_id(self) -> int:
        """The device index."""
        return self._id

    def device_type(self) -> int:
        """The device type number (0 CPU, 1 GPU, ...)."""
        return self._type

    def device_vendor_id(self) -> int:
        """The vendor id (``OrtDeviceVendorId``)."""
        return self._vendor

    def device_mem_type(self) -> int:
        """The memory type (``OrtDeviceMemoryType``)."""
        return self._mem

    @property
    def name(self) -> str:
        """The device name it was made from (``cpu``, ``cuda``...)."""
        return self._name

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, OrtDevice):
            return NotImplemented
        return (self._type, self._mem, self._vendor, self._id) == (other._type, other._mem, other._vendor, other._id)

    def __hash__(self) -> int:
        return hash((self._type, self._mem, self._vendor, self._id))

    def __repr__(self) -> str:
        return f"OrtDevice({self._name}:{self._id}, type={self._type}, vendor={self._vendor:#x}, mem={self._mem})"


class OrtMemoryInfo:
    """A memory location: a name (``Cpu``, ``Cuda``...), allocator type, device index and memory type."""

    def __init__(self, name: str, allocator_type: int, device_id: int, mem_type: int):
        self.name = str(name)
        self.allocator_type = OrtAllocatorType(int(allocator_type))
        self.device_id = int(device_id)
        self.mem_type = OrtMemType(int(mem_type))
        self.device_mem_type = OrtDeviceMemoryType.DEFAULT
        self.device_vendor_id = int(_VENDORS.get(self.name.lower(), OrtDeviceVendorId.NONE))
        self.device_type = _TYPES.get(self.name.lower(), 0)
        self.alignment = 0

    @classmethod
    def create_v2(cls, name: str, device_type: int, vendor_id: int, device_id: int, device_mem_type: int,
                  alignment: int, allocator_type: int) -> OrtMemoryInfo:
        """onnxruntime's second constructor: the device type, vendor and memory kind given directly."""
        info = cls(name, allocator_type, device_id, OrtMemType.DEFAULT)
        info.device_type = int(OrtMemoryInfoDeviceType(int(device_type)))
        info.device_vendor_id = int(vendor_id)
        info.device_mem_type = OrtDeviceMemoryType(int(device_mem_type))
        info.alignment = int(alignment)
        return info

    @classmethod
    def for_device(cls, kind: str, device_id: int = 0) -> OrtMemoryInfo:
        """The memory info of a provider device of ``kind`` (``cpu``, ``cuda``...)."""
        name = "Cpu" if kind == "cpu" else kind.capitalize()
        info = cls(name, OrtAllocatorType.ORT_ARENA_ALLOCATOR if kind == "cpu" else OrtAllocatorType.ORT_DEVICE_ALLOCATOR,
                   device_id, OrtMemType.DEFAULT)
        info.device_type = _TYPES.get(kind, 1)
        info.device_vendor_id = int(_VENDORS.get(kind, OrtDeviceVendorId.NONE))
        return info

    def __repr__(self) -> str:
        return (f"OrtMemoryInfo({self.name!r}, {self.allocator_type.name}, device_id={self.device_id}, "
                f"{self.mem_type.name})")


_ARENA_KEYS = ("max_mem", "arena_extend_strategy", "initial_chunk_size_bytes", "max_dead_bytes_per_chunk",
               "initial_growth_chunk_size_bytes", "max_power_of_two_extend_bytes")


class OrtArenaCfg:
    """Arena settings: ``OrtArenaCfg(max_mem, arena_extend_strategy, initial_chunk_size_bytes,
    max_dead_bytes_per_chunk)`` or ``OrtArenaCfg({"max_mem": ..., ...})``; -1 or 0 means the default.

    onnxrt's host memory comes from numpy and the process heap (tuned by
    ``session.heap_tuning``), so these values are recorded, not applied.
    """

    def __init__(self, *args: Any):
        for k in _ARENA_KEYS:
            setattr(self, k, -1)
        if len(args) == 1 and isinstance(args[0], dict):
            for k, v in args[0].items():
                if k not in _ARENA_KEYS:
                    raise InvalidArgument(f"unknown OrtArenaCfg key {k!r}; known: {', '.join(_ARENA_KEYS)}")
                setattr(self, k, int(v))
        elif len(args) == 4:
            for k, v in zip(_ARENA_KEYS[:4], args):
                setattr(self, k, int(v))
        elif args:
            raise InvalidArgument("OrtArenaCfg takes a dict of settings or four ints "
                                  "(max_mem, arena_extend_strategy, initial_chunk_size_bytes, max_dead_bytes_per_chunk)")

    def __repr__(self) -> str:
        return "OrtArenaCfg(" + ", ".join(f"{k}={getattr(self, k)}" for k in _ARENA_KEYS) + ")"


_registered: dict[tuple[str, str, int], tuple[OrtMemoryInfo, OrtArenaCfg | None, dict]] = {}
_registered_lock = threading.Lock()


def create_and_register_allocator(mem_info: OrtMemoryInfo, arena_cfg: OrtArenaCfg | None) -> None:
    """Register a process-wide allocator description for ``mem_info``'s device (host memory)."""
    _register("CPUExecutionProvider", mem_info, {}, arena_cfg)


def create_and_register_allocator_v2(provider_type: str, mem_info: OrtMemoryInfo, provider_options: dict,
                                     arena_cfg: OrtArenaCfg | None) -> None:
    """Register a process-wide allocator description for ``provider_type``'s device."""
    _register(str(provider_type), mem_info, dict(provider_options or {}), arena_cfg)


def _register(provider: str, mem_info: OrtMemoryInfo, options: dict, arena_cfg: OrtArenaCfg | None) -> None:
    if not isinstance(mem_info, OrtMemoryInfo):
        raise InvalidArgument(f"expected an OrtMemoryInfo, got {type(mem_info).__name__}")
    if arena_cfg is not None and not isinstance(arena_cfg, OrtArenaCfg):
        raise InvalidArgument(f"arena_cfg must be an OrtArenaCfg or None, got {type(arena_cfg).__name__}")
    with _registered_lock:
        _registered[(provider, mem_info.name, mem_info.device_id)] = (mem_info, arena_cfg, options)


def registered_allocators() -> list[tuple[str, OrtMemoryInfo, OrtArenaCfg | None]]:
    """The allocator descriptions registered so far: (provider, memory info, arena settings)."""
    with _registered_lock:
        return [(k[0], v[0], v[1]) for k, v in _registered.items()]
