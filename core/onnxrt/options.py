"""Session and run options, as onnxruntime names them."""

from __future__ import annotations

import enum
import os
from typing import Any

from .errors import InvalidArgument
from .run.limits import default_max_allocation_bytes

__all__ = [
    "GraphOptimizationLevel",
    "ExecutionMode",
    "SessionOptions",
    "RunOptions",
    "MissingConfigEntry",
    "default_thread_count",
    "DEFAULT_MAX_ALLOCATION_BYTES",
]

#: The default cap on any single tensor a model may make (initializers, constant folding
#: or run time): half the memory this process can have (see :mod:`onnxrt.run.limits`).
DEFAULT_MAX_ALLOCATION_BYTES = default_max_allocation_bytes()


def default_thread_count() -> int:
    """The cores this process may use (not the host's whole core count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


class MissingConfigEntry(InvalidArgument, RuntimeError):
    """A configuration key that was never set: an ``InvalidArgument`` and, as onnxruntime
    raises it, a ``RuntimeError``."""


class GraphOptimizationLevel(enum.IntEnum):
    """How much the graph optimizer may rewrite, as in onnxruntime."""

    ORT_DISABLE_ALL = 0
    ORT_ENABLE_BASIC = 1
    ORT_ENABLE_EXTENDED = 2
    ORT_ENABLE_LAYOUT = 3
    ORT_ENABLE_ALL = 99


class ExecutionMode(enum.IntEnum):
    """Sequential or parallel node execution (onnxrt always runs nodes in order)."""

    ORT_SEQUENTIAL = 0
    ORT_PARALLEL = 1


class SessionOptions:
    """Settings for building a session; the attribute names follow onnxruntime.

    Beyond onnxruntime: ``disabled_optimizers`` (transform names to skip) and
    ``max_allocation_bytes`` (cap on any single tensor, guarding against models that
    declare huge constants or shapes; the session config entry
    ``session.max_allocation_bytes`` overrides it).
    """

    def __init__(self) -> None:
        self.graph_optimization_level: GraphOptimizationLevel = GraphOptimizationLevel.ORT_ENABLE_ALL
        self.optimized_model_filepath: str = ""
        self.intra_op_num_threads: int = 0
        self.inter_op_num_threads: int = 0
        self.execution_mode: ExecutionMode = ExecutionMode.ORT_SEQUENTIAL
        self.enable_profiling: bool = False
        self.profile_file_prefix: str = "onnxrt_profile"
        self.log_severity_level: int = 2
        self.log_verbosity_level: int = 0
        self.logid: str = ""
        self.enable_cpu_mem_arena: bool = True
        self.enable_mem_pattern: bool = True
        self.enable_mem_reuse: bool = True
        self.use_deterministic_compute: bool = False
        self.disabled_optimizers: list[str] = []
        self.max_allocation_bytes: int = DEFAULT_MAX_ALLOCATION_BYTES
        self.allow_provider_fallback: bool = False
        self._config: dict[str, str] = {}
        self._free_dims_by_name: dict[str, int] = {}
        self._free_dims_by_denotation: dict[str, int] = {}
        self._initializers: dict[str, Any] = {}
        self._external_initializers: dict[str, Any] = {}
        self._external_files: dict[str, bytes] = {}
        #: onnxruntime's switch between per-session threads and the process-wide pools of
        #: :func:`onnxrt.set_global_thread_pool_sizes`
        self.use_per_session_threads: bool = True
        self._providers: list[tuple[str, dict]] = []
        self._policy = None

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "graph_optimization_level":
            try:
                value = GraphOptimizationLevel(int(value))
            except ValueError:
                raise InvalidArgument(f"unknown graph_optimization_level {value!r}") from None
        elif name in ("intra_op_num_threads", "inter_op_num_threads"):
            if not isinstance(value, int) or value < 0:
                raise InvalidArgument(f"{name} must be a non-negative int, not {value!r}")
        elif name == "max_allocation_bytes":
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise InvalidArgument(f"max_allocation_bytes must be a positive int, not {value!r}")
        elif name == "log_severity_level":
            if value not in (0, 1, 2, 3, 4):
                raise InvalidArgument(f"log_severity_level must be 0..4, not {value!r}")
        object.__setattr__(self, name, value)

    def add_session_config_entry(self, key: str, value: str) -> None:
        """Set a free-form configuration entry, as onnxruntime does."""
        self._config[str(key)] = str(value)

    def get_session_config_entry(self, key: str) -> str:
        """Read a configuration entry; a missing key is an error (a ``RuntimeError``, as in onnxruntime)."""
        try:
            return self._config[key]
        except KeyError:
            raise MissingConfigEntry(f"SessionOptions does not have configuration with key: {key}") from None

    def add_external_initializers(self, names, values) -> None:
        """Supply initializers whose data the model keeps outside itself (an external-data
        location that need not exist): ``names[i]`` takes ``values[i]`` (an array or OrtValue)."""
        names, values = list(names), list(values)
        if len(names) != len(values):
            raise InvalidArgument(f"add_external_initializers: {len(names)} names but {len(values)} values")
        for n, v in zip(names, values):
            self._external_initializers[str(n)] = v

    def add_external_initializers_from_files_in_memory(self, names, buffers, lengths) -> None:
        """Supply the contents of external-data files from memory: a tensor whose
        external-data ``location`` is ``names[i]`` reads ``buffers[i]`` (``lengths[i]`` bytes)
        instead of a file."""
        names, buffers, lengths = list(names), list(buffers), list(lengths)
        if not len(names) == len(buffers) == len(lengths):
            raise InvalidArgument("add_external_initializers_from_files_in_memory: names, buffers and lengths "
                                  f"differ in length ({len(names)}, {len(buffers)}, {len(lengths)})")
        for n, b, k in zip(names, buffers, lengths):
            data = memoryview(b).cast("B")
            if int(k) < 0 or int(k) > len(data):
                raise InvalidArgument(f"in-memory file {n!r}: length {k} but the buffer holds {len(data)} bytes")
            self._external_files[str(n)] = bytes(data[: int(k)])

    def add_provider(self, provider_name: str, provider_options: dict | None = None) -> None:
        """Ask sessions built with these options (and no ``providers`` argument) for
        ``provider_name``, in the order added; the CPU provider is always added last."""
        if not isinstance(provider_name, str) or not provider_name:
            raise InvalidArgument(f"add_provider needs a provider name, not {provider_name!r}")
        self._providers.append((provider_name, dict(provider_options or {})))

    def add_provider_for_devices(self, ep_devices, provider_options: dict | None = None) -> None:
        """Ask for the providers of ``ep_devices`` (from :func:`onnxrt.get_ep_devices`)."""
        from .ep_devices import OrtEpDevice

        devices = list(ep_devices)
        if not devices or not all(isinstance(d, OrtEpDevice) for d in devices):
            raise InvalidArgument("add_provider_for_devices needs OrtEpDevice objects from get_ep_devices()")
        for name in dict.fromkeys(d.ep_name for d in devices):
            self.add_provider(name, provider_options)

    def has_providers(self) -> bool:
        """Whether providers were added with ``add_provider``/``add_provider_for_devices``
        or chosen by a selection policy."""
        return bool(self._providers) or self._policy is not None

    def set_provider_selection_policy(self, policy) -> None:
        """Choose providers by policy (``OrtExecutionProviderDevicePolicy``): ``PREFER_CPU``
        takes the CPU provider only, ``PREFER_GPU`` and ``MAX_PERFORMANCE`` the GPU providers
        first; the others keep the default choice (onnxrt has no NPU providers)."""
        from .ep_devices import OrtExecutionProviderDevicePolicy

        try:
            self._policy = OrtExecutionProviderDevicePolicy(int(policy))
        except (TypeError, ValueError):
            raise InvalidArgument(f"unknown provider selection policy {policy!r}") from None

    def session_providers(self):
        """The providers sessions get from these options when none are passed (``None``: the default)."""
        if self._providers:
            return list(self._providers)
        if self._policy is not None:
            from .ep_devices import providers_for_policy

            return providers_for_policy(self._policy)
        return None

    def register_custom_ops_library(self, library_path: str) -> None:
        """onnxrt runs no compiled custom-op libraries: custom ops come as provider plugins
        (see docs/plugins.md), so this is an error."""
        from .errors import NotImplemented as NotImplementedInOnnxrt

        raise NotImplementedInOnnxrt(
            f"onnxrt cannot load the custom-op library {library_path!r}: it has no C++ kernel interface; "
            "write the ops as an onnxrt provider plugin instead"
        )

    def add_free_dimension_override_by_name(self, name: str, value: int) -> None:
        """Fix a symbolic dimension (by its ``dim_param``) to ``value``."""
        self._free_dims_by_name[str(name)] = int(value)

    def add_free_dimension_override_by_denotation(self, denotation: str, value: int) -> None:
        """Fix every dimension with this denotation to ``value``."""
        self._free_dims_by_denotation[str(denotation)] = int(value)

    def add_initializer(self, name: str, value) -> None:
        """Replace an initializer's value with ``value`` (an array or OrtValue)."""
        self._initializers[str(name)] = value

    def thread_count(self) -> int:
        """The BLAS/kernel thread count this session uses."""
        return self.intra_op_num_threads or default_thread_count()

    def __repr__(self) -> str:
        return (
            f"SessionOptions(level={self.graph_optimization_level.name}, "
            f"threads={self.intra_op_num_threads}, profiling={self.enable_profiling})"
        )


class RunOptions:
    """Per-run settings. Set ``terminate = True`` from another thread to stop a run."""

    def __init__(self) -> None:
        self.terminate: bool = False
        self.logid: str = ""
        self.log_severity_level: int = 2
        self.log_verbosity_level: int = 0
        self.only_execute_path_to_fetches: bool = False
        self._config: dict[str, str] = {}
        self._adapters: list[Any] = []

    def add_active_adapter(self, adapter) -> None:
        """Activate a :class:`~onnxrt.LoraAdapter` for runs with these options: its
        parameters feed the model inputs of the same names (a feed given to ``run`` wins)."""
        from .adapters import LoraAdapter

        if not isinstance(adapter, LoraAdapter):
            raise InvalidArgument(f"add_active_adapter expects a LoraAdapter, got {type(adapter).__name__}")
        self._adapters.append(adapter)

    def add_run_config_entry(self, key: str, value: str) -> None:
        """Set a free-form per-run configuration entry."""
        self._config[str(key)] = str(value)

    def get_run_config_entry(self, key: str) -> str:
        """Read a per-run configuration entry."""
        try:
            return self._config[key]
        except KeyError:
            raise MissingConfigEntry(f"RunOptions does not have configuration with key: {key}") from None
