"""onnxruntime's EP-device and compiled-model compatibility API, as it applies to onnxrt.

``get_ep_devices()`` lists one :class:`OrtEpDevice` per available provider: the
provider's name, its distribution as vendor and version, and the hardware it runs on
(:class:`OrtHardwareDevice`). onnxrt does not probe hardware: the CPU provider runs on
the host CPU (its vendor read from ``/proc/cpuinfo`` where there is one) and every other
provider is reported as running on a GPU of the vendor its device kind names (CUDA:
NVIDIA), with the device kind in the metadata. ``SessionOptions.add_provider_for_devices``
takes these devices to choose a session's providers.

Compiled-model compatibility: a compiled model may carry, per execution provider, a
metadata entry ``ep_compatibility_info.<provider>``; ``get_compatibility_info_from_model``
reads it. onnxrt's providers compile when a session starts and store no compiled data,
so for them every model is ``EP_NOT_APPLICABLE``.
"""

from __future__ import annotations

import enum
import os
from functools import lru_cache
from onnx import ModelProto

from .errors import InvalidArgument

__all__ = [
    "OrtHardwareDeviceType",
    "OrtHardwareDevice",
    "OrtEpDevice",
    "OrtCompiledModelCompatibility",
    "OrtDeviceEpIncompatibilityReason",
    "OrtExecutionProviderDevicePolicy",
    "EpApiError",
    "get_ep_devices",
    "get_hardware_devices",
    "get_hardware_device_ep_incompatibility_details",
    "get_model_compatibility_for_ep_devices",
    "get_compatibility_info_from_model",
    "get_compatibility_info_from_model_bytes",
    "COMPATIBILITY_KEY_PREFIX",
    "providers_for_policy",
]

COMPATIBILITY_KEY_PREFIX = "ep_compatibility_info."


class EpApiError(InvalidArgument, RuntimeError):
    """A bad argument to the EP-device API: an ``InvalidArgument`` and, as onnxruntime
    raises it, a ``RuntimeError``."""


class OrtHardwareDeviceType(enum.IntEnum):
    """The kinds of hardware onnxruntime names."""

    CPU = 0
    GPU = 1
    NPU = 2


class OrtCompiledModelCompatibility(enum.IntEnum):
    """Whether a compiled model suits the given EP devices."""

    EP_NOT_APPLICABLE = 0
    EP_SUPPORTED_OPTIMAL = 1
    EP_SUPPORTED_PREFER_RECOMPILATION = 2
    EP_UNSUPPORTED = 3


class OrtDeviceEpIncompatibilityReason(enum.IntFlag):
    """Why a provider cannot use a hardware device (a bit mask)."""

    NONE = 0
    DRIVER_INCOMPATIBLE = 1
    DEVICE_INCOMPATIBLE = 2
    MISSING_DEPENDENCY = 4
    UNKNOWN = 0x80000000


class OrtExecutionProviderDevicePolicy(enum.IntEnum):
    """How ``SessionOptions.set_provider_selection_policy`` picks providers."""

    DEFAULT = 0
    PREFER_CPU = 1
    PREFER_NPU = 2
    PREFER_GPU = 3
    MAX_PERFORMANCE = 4
    MAX_EFFICIENCY = 5
    MIN_OVERALL_POWER = 6


_VENDORS = {"AuthenticAMD": ("AMD", 0x1022), "GenuineIntel": ("Intel", 0x8086)}


class OrtHardwareDevice:
    """A piece of hardware: ``type``, ``vendor``, ``vendor_id``, ``device_id``, ``metadata``."""

    def __init__(self, type: OrtHardwareDeviceType, vendor: str, vendor_id: int, device_id: int = 0,  # noqa: A002
                 metadata: dict[str, str] | None = None):
        self.type = OrtHardwareDeviceType(type)
        self.vendor = vendor
        self.vendor_id = int(vendor_id)
        self.device_id = int(device_id)
        self.metadata = dict(metadata or {})

    def _key(self) -> tuple:
        return (self.type, self.vendor_id, self.device_id, tuple(sorted(self.metadata.items())))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OrtHardwareDevice) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"OrtHardwareDevice({self.type.name}, vendor={self.vendor!r}, device_id={self.device_id})"


class OrtEpDevice:
    """A provider paired with the hardware it runs on."""

    def __init__(self, ep_name: str, ep_vendor: str, ep_metadata: dict[str, str], device: OrtHardwareDevice,
                 kind: str):
        self.ep_name = ep_name
        self.ep_vendor = ep_vendor
        self.ep_metadata = dict(ep_metadata)
        self.ep_options: dict[str, str] = {}
        self.device = device
        self._kind = kind

    def memory_info(self, memory_type: int = 0):
        """Where this provider's values live (:class:`~onnxrt.OrtMemoryInfo`)."""
        from .devices import OrtMemoryInfo

        return OrtMemoryInfo.for_device(self._kind, self.device.device_id)

    def __repr__(self) -> str:
        return f"OrtEpDevice({self.ep_name}, {self.device!r})"


@lru_cache(maxsize=1)
def _host_cpu() -> OrtHardwareDevice:
    vendor, vid = "", 0
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    vendor, vid = _VENDORS.get(line.split(":", 1)[1].strip(), (line.split(":", 1)[1].strip(), 0))
                    break
    except OSError:  # not Linux: the vendor stays unknown
        pass
    return OrtHardwareDevice(OrtHardwareDeviceType.CPU, vendor, vid, 0, {})


def _hardware_for(cls) -> tuple[OrtHardwareDevice, str]:
    kind = (cls.aliases[0] if cls.aliases else cls.name).lower()
    if kind == "cpu":
        return _host_cpu(), kind
    vendor, vid = {"cuda": ("NVIDIA", 0x10DE)}.get(kind, ("", 0))
    return OrtHardwareDevice(OrtHardwareDeviceType.GPU, vendor, vid, 0, {"onnxrt_device_kind": kind}), kind


def get_ep_devices() -> list[OrtEpDevice]:
    """One :class:`OrtEpDevice` per available provider, in default priority order."""
    from .plugin.discovery import _availability, provider_registry

    out = []
    for cls in provider_registry().classes():
        if _availability(cls) is not None:
            continue
        dist, version = cls.distribution or ("onnxrt", "")
        device, kind = _hardware_for(cls)
        out.append(OrtEpDevice(cls.name, dist, {"version": version}, device, kind))
    return out


def get_hardware_devices() -> list[OrtHardwareDevice]:
    """The hardware the available providers run on (the host CPU first)."""
    seen: list[OrtHardwareDevice] = [_host_cpu()]
    for d in get_ep_devices():
        if d.device not in seen:
            seen.append(d.device)
    return seen


def get_hardware_device_ep_incompatibility_details(ep_name: str, hardware_device: OrtHardwareDevice) -> dict:
    """``{"reasons_bitmask", "notes", "error_code"}``: why provider ``ep_name`` cannot use
    ``hardware_device`` (0 and ``None`` when it can)."""
    from .plugin.discovery import _availability, provider_registry

    if not ep_name:
        raise EpApiError("ep_name must name an execution provider")
    if not isinstance(hardware_device, OrtHardwareDevice):
        raise EpApiError(f"expected an OrtHardwareDevice, got {type(hardware_device).__name__}")
    cls = provider_registry().lookup(ep_name)
    if cls is None:
        raise EpApiError(f"No valid factory found for execution provider {ep_name!r}")
    why = _availability(cls)
    if why is not None:
        return {"reasons_bitmask": int(OrtDeviceEpIncompatibilityReason.MISSING_DEPENDENCY), "notes": why,
                "error_code": 0}
    device, _ = _hardware_for(cls)
    if device.type != hardware_device.type:
        return {"reasons_bitmask": int(OrtDeviceEpIncompatibilityReason.DEVICE_INCOMPATIBLE),
                "notes": f"{cls.name} runs on a {device.type.name}, not a {hardware_device.type.name}",
                "error_code": 0}
    return {"reasons_bitmask": 0, "notes": None, "error_code": 0}


def get_model_compatibility_for_ep_devices(ep_devices: list[OrtEpDevice],
                                           compatibility_info: str) -> OrtCompiledModelCompatibility:
    """How well a model compiled with ``compatibility_info`` suits ``ep_devices`` (all of
    one provider). onnxrt's providers store no compiled data: ``EP_NOT_APPLICABLE``."""
    if not isinstance(compatibility_info, str):
        raise TypeError(f"compatibility_info must be a str, not {type(compatibility_info).__name__}")
    devices = list(ep_devices)
    if not devices:
        raise EpApiError("ep_devices is empty: pass the EP devices the model would run on")
    if not all(isinstance(d, OrtEpDevice) for d in devices):
        raise EpApiError("ep_devices must hold OrtEpDevice objects (from get_ep_devices())")
    if len({d.ep_name for d in devices}) != 1:
        raise EpApiError("all ep_devices must belong to one execution provider")
    return OrtCompiledModelCompatibility.EP_NOT_APPLICABLE


def _compat_info(proto: ModelProto, ep_type: str) -> str | None:
    key = COMPATIBILITY_KEY_PREFIX + ep_type
    return next((p.value for p in proto.metadata_props if p.key == key), None)


def get_compatibility_info_from_model_bytes(model_data: bytes, ep_type: str) -> str | None:
    """The compatibility string ``ep_type`` stored in a serialized model, or ``None``."""
    from google.protobuf.message import DecodeError

    if not model_data:
        raise EpApiError("model_data is empty")
    if not ep_type:
        raise EpApiError("ep_type must name an execution provider")
    proto = ModelProto()
    try:
        proto.ParseFromString(bytes(model_data))
    except (DecodeError, ValueError) as e:
        raise EpApiError(f"model_data is not a serialized ONNX model: {e}") from None
    if not proto.HasField("graph") and not proto.metadata_props:
        raise EpApiError("model_data is not a serialized ONNX model (it has no graph)")
    return _compat_info(proto, ep_type)


def get_compatibility_info_from_model(model_path: str | os.PathLike, ep_type: str) -> str | None:
    """The compatibility string ``ep_type`` stored in the model file, or ``None``."""
    if not model_path:
        raise EpApiError("model_path is empty")
    if not ep_type:
        raise EpApiError("ep_type must name an execution provider")
    try:
        with open(os.fspath(model_path), "rb") as f:
            data = f.read()
    except OSError as e:
        raise EpApiError(f"cannot read model file {os.fspath(model_path)!r}: {e.strerror or e}") from None
    return get_compatibility_info_from_model_bytes(data, ep_type)


def providers_for_policy(policy: OrtExecutionProviderDevicePolicy) -> list[str] | None:
    """The providers a selection policy gives a session (``None``: the default choice)."""
    policy = OrtExecutionProviderDevicePolicy(int(policy))
    devices = get_ep_devices()
    if policy == OrtExecutionProviderDevicePolicy.PREFER_CPU:
        return ["CPUExecutionProvider"]
    if policy in (OrtExecutionProviderDevicePolicy.PREFER_GPU, OrtExecutionProviderDevicePolicy.MAX_PERFORMANCE):
        gpus = [d.ep_name for d in devices if d.device.type == OrtHardwareDeviceType.GPU]
        return gpus + ["CPUExecutionProvider"]
    # no NPU providers exist for onnxrt; efficiency and power policies keep the default choice
    return None
