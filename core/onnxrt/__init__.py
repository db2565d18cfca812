"""onnxrt: an ONNX inference runtime for Python, built from pluggable execution providers.

Use it as you would onnxruntime::

    import onnxrt as ort
    sess = ort.InferenceSession("model.onnx", providers=["CPUExecutionProvider"])
    y, = sess.run(None, {"x": x})
"""

from . import errors
from .errors import (
    EPFail,
    Fail,
    InvalidArgument,
    InvalidGraph,
    InvalidProtobuf,
    NoModel,
    NoSuchFile,
    NotImplemented,
    OnnxRtError,
    RuntimeException,
)
from .plugin.hookspecs import hookimpl
from .plugin.kernel import Kernel, KernelRegistry, NodeInfo
from .options import ExecutionMode, GraphOptimizationLevel, RunOptions, SessionOptions
from .ortvalue import IOBinding, OrtValue, get_device
from .plugin.discovery import get_all_providers, get_available_providers, get_provider_info
from .plugin.provider import Capability, Device, ExecutionProvider
from .session import InferenceSession, ModelMetadata
from .run.feeds import NodeArg
from .devices import (
    OrtAllocatorType,
    OrtArenaCfg,
    OrtDevice,
    OrtDeviceMemoryType,
    OrtDeviceVendorId,
    OrtMemoryInfo,
    OrtMemoryInfoDeviceType,
    OrtMemType,
    create_and_register_allocator,
    create_and_register_allocator_v2,
)
from .environment import (
    disable_telemetry_events,
    enable_telemetry_events,
    get_build_info,
    get_version_string,
    set_default_logger_callback,
    set_default_logger_severity,
    set_default_logger_verbosity,
    set_global_thread_pool_sizes,
)
from .sparse import OrtSparseFormat, SparseTensor
from .adapters import AdapterFormat, LoraAdapter
from .model_compiler import ModelCompiler, OrtCompileApiFlags, OrtExternalInitializerInfo
from .ep_devices import (
    OrtCompiledModelCompatibility,
    OrtDeviceEpIncompatibilityReason,
    OrtEpDevice,
    OrtExecutionProviderDevicePolicy,
    OrtHardwareDevice,
    OrtHardwareDeviceType,
    get_compatibility_info_from_model,
    get_compatibility_info_from_model_bytes,
    get_ep_devices,
    get_hardware_device_ep_incompatibility_details,
    get_hardware_devices,
    get_model_compatibility_for_ep_devices,
)


def __getattr__(name: str):
    # Predictor is imported when first named: it brings hashlib (OpenSSL's libcrypto,
    # 3 MiB resident) and pickle, which a session never needs
    if name == "Predictor":
        from .predictor import Predictor

        globals()["Predictor"] = Predictor
        return Predictor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | {"Predictor"})


try:
    from importlib.metadata import version as _version

    __version__ = _version("onnxrt")
except Exception:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0"

__all__ = [
    "InferenceSession",
    "SessionOptions",
    "RunOptions",
    "GraphOptimizationLevel",
    "ExecutionMode",
    "NodeArg",
    "OrtValue",
    "IOBinding",
    "ModelMetadata",
    "Predictor",
    "get_device",
    "get_available_providers",
    "get_all_providers",
    "get_provider_info",
    "ExecutionProvider",
    "Device",
    "Capability",
    "Kernel",
    "KernelRegistry",
    "NodeInfo",
    "hookimpl",
    "errors",
    "OnnxRtError",
    "Fail",
    "InvalidArgument",
    "NoSuchFile",
    "NoModel",
    "InvalidProtobuf",
    "InvalidGraph",
    "NotImplemented",
    "EPFail",
    "RuntimeException",
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
    "get_build_info",
    "get_version_string",
    "enable_telemetry_events",
    "disable_telemetry_events",
    "set_default_logger_callback",
    "set_default_logger_severity",
    "set_default_logger_verbosity",
    "set_global_thread_pool_sizes",
    "SparseTensor",
    "OrtSparseFormat",
    "AdapterFormat",
    "LoraAdapter",
    "ModelCompiler",
    "OrtCompileApiFlags",
    "OrtExternalInitializerInfo",
    "OrtEpDevice",
    "OrtHardwareDevice",
    "OrtHardwareDeviceType",
    "OrtCompiledModelCompatibility",
    "OrtDeviceEpIncompatibilityReason",
    "OrtExecutionProviderDevicePolicy",
    "get_ep_devices",
    "get_hardware_devices",
    "get_hardware_device_ep_incompatibility_details",
    "get_model_compatibility_for_ep_devices",
    "get_compatibility_info_from_model",
    "get_compatibility_info_from_model_bytes",
    "__version__",
]
