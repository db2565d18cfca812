"""The execution-provider contract between the core and every provider package.

A provider says what it can run (:meth:`ExecutionProvider.get_capability`), builds
kernels for the nodes it takes, and describes its memory through a :class:`Device`.
Values crossing a provider boundary are host numpy arrays, the standard form; the
planner inserts copy steps that call ``device.to_host``/``device.from_host``.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any, ClassVar

import numpy as np

from ..errors import InvalidArgument
from .kernel import Kernel, KernelRegistry, NodeInfo

__all__ = ["Device", "HostDevice", "ExecutionProvider", "Capability", "group_io", "flag_option", "size_option",
           "selector_option"]


class Device:
    """How a provider's arrays are allocated, moved to and from the host, and synced."""

    #: short device kind, as ``OrtValue.device_name()`` reports it: "cpu", "cuda", ...
    kind: str = "cpu"
    device_id: int = 0
    #: optional: a callable returning a context manager that the plan enters once around
    #: each run, on the thread that runs it (a GPU provider makes its device, stream and
    #: memory pool current there, rather than once per kernel call); the core also enters
    #: it while it builds this device's kernels and uploads its constants
    run_scope: Any = None

    @property
    def is_host(self) -> bool:
        """Whether values on this device are plain host numpy arrays."""
        return self.kind == "cpu"

    def to_host(self, value: Any) -> Any:
        """Copy a device value to a host numpy array (sequences element-wise)."""
        return value

    def from_host(self, value: Any) -> Any:
        """Copy a host value onto the device."""
        return value

    def synchronize(self) -> None:
        """Wait for queued device work to finish."""

    def __repr__(self) -> str:
        return f"<Device {self.kind}:{self.device_id}>"


def device_scope(device: Device):
    """``device.run_scope()`` when the device has one, else a context that does nothing:
    what the core enters around work for a device outside a run (building its kernels,
    uploading its constants)."""
    scope = getattr(device, "run_scope", None)
    return scope() if scope is not None else nullcontext()


class HostDevice(Device):
    """The host: numpy arrays, no copies."""

    kind = "cpu"


class Capability:
    """A group of nodes a provider takes.

    One node with a kernel is the common case. A group of several nodes is a fused
    subgraph that the provider turns into one callable with :meth:`ExecutionProvider.compile`.
    """

    __slots__ = ("nodes", "fused_name")

    def __init__(self, nodes: list, fused_name: str | None = None):
        self.nodes = list(nodes)
        self.fused_name = fused_name

    def __repr__(self) -> str:
        return f"Capability({[n.name for n in self.nodes]})"


def flag_option(v: Any) -> bool:
    """A boolean provider option: ``True``/``False``, 0/1, or the strings onnxruntime
    users pass (``"1"``, ``"true"``, ``"on"``, ``"0"``, ``"false"``, ``"off"``, ...).

    For :attr:`ExecutionProvider.option_types`; anything else is a ``ValueError``,
    which the base class reports as an ``InvalidArgument`` naming the option.
    """
    if isinstance(v, str):
        low = v.strip().lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise ValueError("expected a boolean")
    if not isinstance(v, (bool, int, np.integer)):
        raise ValueError("expected a boolean")
    return bool(v)


def selector_option(v: Any) -> int | str:
    """A device (or platform) selector provider option: an index (an int or its digit
    string) or a name substring; ``ValueError`` for anything else."""
    if isinstance(v, bool):
        raise ValueError("expected an index or a name")
    if isinstance(v, int):
        return v
    s = str(v).strip()
    if not s:
        raise ValueError("expected an index or a name")
    return int(s) if s.lstrip("-").isdigit() else s


def size_option(v: Any) -> int:
    """A byte count provider option (an int or its string), 0 meaning no limit."""
    n = int(v)
    if n < 0:
        raise ValueError("must be >= 0 (0: no limit)")
    return n


def group_io(graph, nodes: list) -> tuple[list[str], list[str]]:
    """The external inputs and outputs of a fused group, in the order of the call.

    This is the calling convention of a kernel made by :meth:`ExecutionProvider.compile`:
    the session passes the group's inputs (values read by its nodes but made outside it)
    in the order the nodes first read them, and expects back, in node order, the outputs
    that are read after the group or returned by the graph.
    """
    inside = {id(n) for n in nodes}
    produced = {o for n in nodes for o in n.outputs if o}
    inputs: dict[str, None] = {}
    for n in nodes:
        for i in n.inputs:
            if i and i not in produced:
                inputs[i] = None
    used_outside = set(graph.output_names())
    for n in graph.nodes:
        if id(n) not in inside:
            used_outside.update(n.inputs)
            if n.subgraphs:
                used_outside.update(n.implicit_inputs())
    outputs = [o for n in nodes for o in n.outputs if o and o in used_outside]
    return list(inputs), outputs


class ExecutionProvider:
    """Base class of execution providers.

    Subclasses set ``name`` (onnxruntime's naming, e.g. ``"CPUExecutionProvider"``),
    ``aliases`` (e.g. ``("cpu",)``), ``priority`` (higher is preferred by default),
    ``option_types`` (option name -> callable converting the user's value), and
    implement :meth:`build_registry` and, if needed, :meth:`is_available`.
    """

    name: ClassVar[str] = ""
    aliases: ClassVar[tuple[str, ...]] = ()
    priority: ClassVar[int] = 0
    option_types: ClassVar[dict[str, Any]] = {}
    default_options: ClassVar[dict[str, Any]] = {}
    concurrent_run_supported: ClassVar[bool] = True
    #: whether a device provider is offered nodes with subgraphs (If, Loop, Scan); the
    #: core keeps them on the CPU otherwise (host providers are always offered them)
    runs_control_flow: ClassVar[bool] = False
    #: filled in by the plugin registry: (distribution, version) that provided the class
    distribution: ClassVar[tuple[str, str] | None] = None

    _registries: ClassVar[dict[type, KernelRegistry]] = {}

    def __init__(self, options: dict[str, Any] | None = None, session_options=None):
        self.options = self.validate_options(options or {})
        self.session_options = session_options
        self.device: Device = self.create_device()

    # -- class-level facts ----------------------------------------------------------
    @classmethod
    def is_available(cls) -> str | None:
        """``None`` if this provider can run here, otherwise the reason it cannot."""
        return None

    @classmethod
    def details(cls) -> str:
        """What else a user should know about this provider here, in one line (which
        optional accelerated kernels it loaded, say); empty by default. Shown by
        ``onnxrt providers`` and ``get_provider_info()``; keep it cheap."""
        return ""

    @classmethod
    def validate_options(cls, options: dict[str, Any]) -> dict[str, Any]:
        """Check and convert provider options; an unknown key is an error."""
        out = dict(cls.default_options)
        for k, v in options.items():
            if k not in cls.option_types:
                known = ", ".join(sorted(cls.option_types)) or "none"
                raise InvalidArgument(f"{cls.name}: unknown provider option {k!r} (known: {known})")
            try:
                out[k] = cls.option_types[k](v)
            except (TypeError, ValueError) as e:
                raise InvalidArgument(f"{cls.name}: bad value {v!r} for option {k!r}: {e}") from None
        return out

    @classmethod
    def build_registry(cls) -> KernelRegistry:
        """Return a new registry with this provider's own kernels."""
        return KernelRegistry()

    @classmethod
    def kernel_registry(cls) -> KernelRegistry:
        """The provider's kernels plus those plugins added (built once per class)."""
        reg = ExecutionProvider._registries.get(cls)
        if reg is None:
            reg = cls.build_registry()
            from .discovery import plugin_manager

            plugin_manager().hook.onnxrt_register_kernels(provider_name=cls.name, registry=reg)
            ExecutionProvider._registries[cls] = reg
        return reg

    # -- per-session ------------------------------------------------------------------
    def create_device(self) -> Device:
        """The device this provider's values live on."""
        return HostDevice()

    def get_capability(self, graph, node_info) -> list[Capability]:
        """Return the groups of nodes this provider takes among ``graph.candidates``.

        :param graph: a :class:`onnxrt.partition.GraphView`: the whole graph reads
            through it (``nodes``, ``initializers``, ``value_types``, ...), and its
            ``candidates`` are the nodes this provider may take, in topological order.
        :param node_info: a callable ``node -> NodeInfo`` giving types and opsets.

        The default takes every candidate it has a kernel for, one at a time. The core
        applies the partition policy around this answer (shape computations and host
        Constants stay on the CPU for device providers; refusals are recorded), so a
        provider only says what it can run.
        """
        reg = self.kernel_registry()
        return [Capability([node]) for node in graph.candidates if reg.find(node_info(node))[0] is not None]

    def refusal_reason(self, node_info: NodeInfo) -> str:
        """Why this provider does not take a node (for the assignment report)."""
        _, why = self.kernel_registry().find(node_info)
        return why or "not claimed"

    def create_kernel(self, node_info: NodeInfo) -> Kernel:
        """Build the kernel for one node this provider took, on this provider's device
        (the core enters the device's ``run_scope`` around this call)."""
        return self.kernel_registry().create(node_info, self.device)

    def compile(self, capability: Capability, graph, node_info) -> Kernel:
        """Turn a fused group of nodes into one kernel (compiling providers override)."""
        raise NotImplementedError(f"{self.name} does not compile fused groups")

    def __repr__(self) -> str:
        return f"<{self.name} {self.options}>"


def is_numpy(value) -> bool:
    """Whether ``value`` is a host array."""
    return isinstance(value, np.ndarray)
