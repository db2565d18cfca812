"""Kernels and the kernel registry.

A kernel is built once per node, when a session is created: it parses the node's
attributes and may prepack constant inputs. It is then called many times with input
arrays and returns its outputs. Kernels never keep per-run state on themselves, so
one kernel may be called from many threads at once.

Two ways to write one, both registered with explicit keys (op, domain, opset range)::

    from onnxrt.plugin.kernel import Kernel, KernelRegistry

    registry = KernelRegistry()

    @registry.op("LeakyRelu", since=6)
    def leaky_relu(k, x, *, alpha=0.01):
        # inputs are positional, attributes are keyword-only with their defaults
        return k.xp.where(x >= 0, x, x * x.dtype.type(alpha))

    @registry.op("Gemm", since=13)
    class Gemm(Kernel):
        def setup(self):                 # once per node: parse attributes, prepack
            self.trans_b = self.attrs.get("transB", 0)

        def run(self, a, b, c=None):     # per call: return a tuple of outputs
            ...
            return (y,)

Function kernels may return one value or a tuple of values; class kernels return a
tuple (or list) of outputs. A value is a numpy array, a Python list (a sequence),
``None`` (an absent optional) or, for ``ai.onnx.ml`` ZipMap, a list of dicts. Absent
optional inputs arrive as ``None``.

A kernel that can tell, from what it knows of its node (static types and shapes,
constant inputs), that a run would come down to one call may say so with a
:class:`DirectCall` (``Kernel.direct_call``; ``@registry.op(..., direct=...)`` for a function
kernel): the plan's generated code then makes that call in place of ``run``::

    def _neg_direct(k):
        # float32 known statically: np.negative is all Neg does
        if k.xp is np and k.node.input_dtype(0) == np.float32:
            return DirectCall(np.negative, kwargs={"out": ...})  # out=...: 0-d stays an array
        return None

    @registry.op("Neg", since=13, direct=_neg_direct)
    def neg(k, x):
        ...

A kernel's version range is ``[since, end]`` in the node's *domain opset* (the model's
``opset_import`` for that domain). When ``end`` is not given it runs up to the next
registration of the same op, as onnxruntime's versioned kernels do.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping

import numpy as np
import onnx
from onnx import AttributeProto, numpy_helper

from ..dtypes import np_dtype

__all__ = [
    "NodeInfo",
    "Kernel",
    "FunctionKernel",
    "DirectCall",
    "KernelDef",
    "KernelRegistry",
    "NoKernelError",
    "decode_attribute",
]

INF_VERSION = 1 << 30


@dataclass
class NodeInfo:
    """What a kernel learns about its node when it is built.

    :ivar name: the node's name (may be empty in the model; the IR fills one in).
    :ivar op_type: e.g. ``"Conv"``.
    :ivar domain: ``""`` for ai.onnx, ``"ai.onnx.ml"``, ``"com.microsoft"``...
    :ivar opset: the model's opset version for ``domain``.
    :ivar attrs: decoded attributes: int, float, str, list, numpy array (TENSOR),
        a callable :class:`Subgraph` (GRAPH), ``onnx.TypeProto`` (TYPE_PROTO).
    :ivar inputs: input value names (``""`` for an absent optional input).
    :ivar outputs: output value names (``""`` for an unused optional output).
    :ivar input_types: ``onnx.TypeProto`` of each input, or ``None`` where unknown.
    :ivar output_types: ``onnx.TypeProto`` of each output, or ``None`` where unknown.
    :ivar constants: input index -> array, for inputs that are constant initializers
        (never overridable at run time), so kernels can prepack them in ``setup``.
    :ivar implicit_inputs: outer-scope names the node's subgraphs read; control-flow
        kernels receive their values as ``outer=`` (a dict) when they run.
    """

    name: str
    op_type: str
    domain: str = ""
    opset: int = INF_VERSION
    attrs: dict[str, Any] = field(default_factory=dict)
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    input_types: list[Any] = field(default_factory=list)
    output_types: list[Any] = field(default_factory=list)
    constants: dict[int, Any] = field(default_factory=dict)
    implicit_inputs: list[str] = field(default_factory=list)

    def input_dtype(self, i: int) -> np.dtype | None:
        """The numpy dtype of tensor input ``i`` when it is known statically."""
        return _tensor_dtype(self.input_types, i)

    def output_dtype(self, i: int) -> np.dtype | None:
        """The numpy dtype of tensor output ``i`` when it is known statically."""
        return _tensor_dtype(self.output_types, i)

    def input_shape(self, i: int) -> tuple[int | str | None, ...] | None:
        """The static shape of tensor input ``i``: an int for a known dimension, the
        name of a symbolic one (equal names are equal sizes), None for an unknown one;
        None when even the rank is unknown."""
        if i >= len(self.input_types) or self.input_types[i] is None:
            return None
        tp = self.input_types[i]
        if not tp.HasField("tensor_type") or not tp.tensor_type.HasField("shape"):
            return None
        return tuple(int(d.dim_value) if d.HasField("dim_value") else (d.dim_param or None)
                     for d in tp.tensor_type.shape.dim)

    def describe(self) -> str:
        """``Conv 'conv1' (ai.onnx opset 13)``: how errors name a node."""
        dom = self.domain or "ai.onnx"
        return f"{self.op_type} {self.name!r} ({dom} opset {self.opset})"


def _tensor_dtype(types: list, i: int) -> np.dtype | None:
    if i >= len(types) or types[i] is None:
        return None
    tp = types[i]
    if tp.HasField("tensor_type") and tp.tensor_type.elem_type:
        return np_dtype(tp.tensor_type.elem_type)
    return None


class Kernel:
    """Base class of class-style kernels.

    Subclasses override :meth:`setup` (once per node) and :meth:`run` (per call).
    ``xp`` is the array namespace the kernel computes with: numpy for the CPU
    provider; a device provider may bind the same kernel to another namespace.
    ``host_inputs`` names the input positions a device kernel reads on the host
    (a Reshape's shape, a Slice's starts): the plan hands them over as host arrays,
    so a value computed on the CPU is never uploaded only to be read back.
    """

    xp = np
    host_inputs: frozenset = frozenset()

    def __init__(self, node: NodeInfo, device=None):
        self.node = node
        self.attrs = node.attrs
        #: the :class:`~onnxrt.plugin.Device` the kernel computes on (``None``: the host),
        #: known before :meth:`setup` so that a device kernel prepares its programs there
        self.device = device
        self.setup()

    def setup(self) -> None:
        """Parse attributes and prepack constant inputs. Called once per node."""

    def run(self, *inputs):  # pragma: no cover - abstract
        """Compute the outputs. Must return a tuple or list with one entry per output."""
        raise NotImplementedError

    def direct_call(self) -> DirectCall | None:
        """A call equivalent to :meth:`run` for this node, or None (the default).

        Asked once, when the plan's code is generated (on its first run), for nodes
        with one output. A kernel returns a :class:`DirectCall` only where what it knows of
        its node (``self.node``: static input types and shapes, constants) makes
        ``run`` nothing but that call, for any input the node can receive."""
        return None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} for {self.node.describe()}>"


@dataclass(frozen=True)
class DirectCall:
    """A kernel's one call for a node: ``fn(*inputs, *args, **kwargs)`` returns the value
    of the node's (only) output, as ``run(*inputs)[0]`` would.

    :ivar fn: typically a numpy ufunc or array method, called with no Python frame
        of the kernel's between the plan and it.
    :ivar args: values passed after the inputs (a prepared constant, a target shape).
    :ivar kwargs: keyword arguments (``{"out": ...}`` makes a ufunc return a 0-d
        array, not a numpy scalar, for 0-d inputs).
    :ivar inputs: the positions of the node's inputs to pass (all of them if None).

    The value must be what ``run`` would give: an array, never a numpy scalar.
    """

    fn: Callable
    args: tuple = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    inputs: tuple[int, ...] | None = None


def _as_value(v):
    if isinstance(v, np.generic):
        return np.asarray(v)
    return v


class FunctionKernel(Kernel):
    """Adapts a plain function ``fn(k, *inputs, **attributes)`` to the kernel protocol.

    The plan's generated code calls ``fn`` itself (``fn(k, x, alpha=...)``) and passes
    its result through :meth:`first_output` (or :meth:`outputs`) only where it is not
    already an array; :meth:`run` is the same call for other callers."""

    fn: Callable = None  # type: ignore[assignment]
    attr_names: frozenset | None = None  # None: the function takes **kwargs
    #: ``direct_fn(kernel) -> DirectCall | None`` (``@registry.op(..., direct=...)``)
    direct_fn: Callable | None = None

    def setup(self) -> None:
        if self.attr_names is None:
            self.kw = dict(self.attrs)
        else:
            self.kw = {k: v for k, v in self.attrs.items() if k in self.attr_names}

    def run(self, *inputs):
        r = type(self).fn(self, *inputs, **self.kw)
        # arrays pass as they are; the type test first, as this runs for every node
        if type(r) is tuple:
            return tuple([v if type(v) is np.ndarray else _as_value(v) for v in r])
        return (r if type(r) is np.ndarray else _as_value(r),)

    def direct_call(self) -> DirectCall | None:
        """What the registration's ``direct`` function returns for this node (None without one)."""
        d = type(self).direct_fn
        return None if d is None else d(self)

    @staticmethod
    def first_output(r):
        """The first output of a function's result ``r`` (one value, or a tuple of
        values), a numpy scalar made a 0-d array; None for an empty tuple."""
        if type(r) is tuple:
            return _as_value(r[0]) if r else None
        return _as_value(r)

    @staticmethod
    def outputs(r, n: int) -> tuple:
        """A function's result ``r`` as exactly ``n`` output values (numpy scalars made
        0-d arrays; missing trailing outputs None, extra ones dropped)."""
        vals = [_as_value(v) for v in r] if type(r) is tuple else [_as_value(r)]
        if len(vals) != n:
            vals = (vals + [None] * n)[:n]
        return tuple(vals)


def _function_kernel_class(fn: Callable, direct: Callable | None = None) -> type[Kernel]:
    sig = inspect.signature(fn)
    names: set[str] | None = set()
    for p in sig.parameters.values():
        if p.kind is p.KEYWORD_ONLY:
            names.add(p.name)
        elif p.kind is p.VAR_KEYWORD:
            names = None
            break
    return type(
        fn.__name__,
        (FunctionKernel,),
        {
            "fn": staticmethod(fn),
            "attr_names": None if names is None else frozenset(names),
            "direct_fn": None if direct is None else staticmethod(direct),
            "__doc__": fn.__doc__,
            "__module__": fn.__module__,
        },
    )


@dataclass
class KernelDef:
    """One registration: a kernel class for (domain, op_type) over an opset range.

    :ivar types: optional type constraints, ``{"T": {np.dtype, ...}}`` keyed by the
        schema's type-parameter names; a node whose input types fall outside is refused.
    :ivar accepts: optional ``fn(node_info) -> None | str``; a string refuses the node
        and says why.
    """

    op_type: str
    domain: str
    since: int
    end: int | None
    cls: type[Kernel]
    types: dict[str, frozenset] | None = None
    accepts: Callable[[NodeInfo], str | None] | None = None

    def version_range(self) -> str:
        end = "" if self.end is None or self.end >= INF_VERSION else str(self.end)
        return f"[{self.since}, {end or '...'}]"


class NoKernelError(LookupError):
    """No registered kernel fits a node; the message says what does exist."""


class KernelRegistry:
    """Kernels keyed by (domain, op_type), resolved by opset range and input types."""

    def __init__(self) -> None:
        self._defs: dict[tuple[str, str], list[KernelDef]] = {}
        self._sealed_ranges: dict[tuple[str, str], list[tuple[int, int, KernelDef]]] = {}

    # -- registration -------------------------------------------------------------
    def op(
        self,
        op_type: str,
        since: int = 1,
        *,
        domain: str = "",
        end: int | None = None,
        types: dict[str, Iterable] | None = None,
        accepts: Callable[[NodeInfo], str | None] | None = None,
        direct: Callable[[Kernel], DirectCall | None] | None = None,
    ) -> Callable:
        """Decorator registering a kernel class or function for ``op_type``.

        :param op_type: the ONNX op name.
        :param since: the first domain opset version the kernel implements.
        :param domain: the op's domain (``""`` is ai.onnx).
        :param end: the last version it implements; by default up to the next
            registration of the same op.
        :param types: type constraints, e.g. ``{"T": [np.float32, np.float64]}``.
        :param accepts: a predicate refusing nodes it cannot run, with a reason.
        :param direct: for a function kernel, ``direct(kernel) -> DirectCall | None``: the
            one call its runs come down to for that node, if any (see :class:`DirectCall`);
            a kernel class overrides :meth:`Kernel.direct_call` instead.
        """
        if direct is not None and inspect.isclass(direct):
            raise TypeError("direct= takes a function of the kernel returning a DirectCall or None")

        def deco(obj):
            if isinstance(obj, type):
                if direct is not None:
                    raise TypeError(f"{obj.__name__}: a kernel class overrides direct_call() instead of direct=")
                cls = obj
            else:
                cls = _function_kernel_class(obj, direct)
            self.register(
                KernelDef(
                    op_type,
                    _norm_domain(domain),
                    since,
                    end,
                    cls,
                    None if types is None else {k: frozenset(np.dtype(t) for t in v) for k, v in types.items()},
                    accepts,
                )
            )
            return obj

        return deco

    def register(self, kdef: KernelDef) -> None:
        """Add a :class:`KernelDef`."""
        key = (kdef.domain, kdef.op_type)
        self._defs.setdefault(key, []).append(kdef)
        self._sealed_ranges.pop(key, None)

    def update(self, other: "KernelRegistry") -> None:
        """Add every registration of ``other`` (used to merge plugin kernels)."""
        for d in other:
            self.register(d)

    def __iter__(self) -> Iterator[KernelDef]:
        """Every registration, in the order they were made per (domain, op_type)."""
        for defs in list(self._defs.values()):
            yield from defs

    # -- lookup -------------------------------------------------------------------
    def _ranges(self, key):
        rng = self._sealed_ranges.get(key)
        if rng is None:
            defs = sorted(self._defs.get(key, []), key=lambda d: d.since)
            sinces = sorted({d.since for d in defs})
            rng = []
            for d in defs:
                if d.end is not None:
                    end = d.end
                else:
                    later = [s for s in sinces if s > d.since]
                    end = later[0] - 1 if later else INF_VERSION
                rng.append((d.since, end, d))
            self._sealed_ranges[key] = rng
        return rng

    def has_op(self, op_type: str, domain: str = "") -> bool:
        """Whether any version of ``op_type`` is registered."""
        return (_norm_domain(domain), op_type) in self._defs

    def ops(self) -> list[tuple[str, str, str]]:
        """Every registration as ``(domain, op_type, version range)``, sorted."""
        out = []
        for (dom, op), defs in self._defs.items():
            for lo, hi, d in self._ranges((dom, op)):
                out.append((dom, op, d.version_range() if d.end else _fmt_range(lo, hi)))
        return sorted(out)

    def find(self, node: NodeInfo) -> tuple[KernelDef | None, str]:
        """Return ``(kernel_def, "")`` or ``(None, reason)`` for ``node``."""
        key = (_norm_domain(node.domain), node.op_type)
        rng = self._ranges(key)
        if not rng:
            return None, f"no kernel for {node.op_type} in domain {node.domain or 'ai.onnx'!r}"
        in_range = [d for lo, hi, d in rng if lo <= node.opset <= hi]
        if not in_range:
            have = ", ".join(_fmt_range(lo, hi) for lo, hi, _ in rng)
            return None, (
                f"no kernel for {node.op_type} at opset {node.opset}; kernels exist for opsets {have}"
            )
        reasons = []
        for d in in_range:
            why = _type_mismatch(d, node)
            if why is None and d.accepts is not None:
                why = d.accepts(node)
            if why is None:
                return d, ""
            reasons.append(why)
        return None, "; ".join(reasons)

    def create(self, node: NodeInfo, device=None) -> Kernel:
        """Build the kernel for ``node`` on ``device`` or raise :class:`NoKernelError`."""
        d, why = self.find(node)
        if d is None:
            raise NoKernelError(f"{node.describe()}: {why}")
        return d.cls(node, device)


def _fmt_range(lo: int, hi: int) -> str:
    return f"[{lo}, {'...' if hi >= INF_VERSION else hi}]"


def _norm_domain(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


def _type_mismatch(d: KernelDef, node: NodeInfo) -> str | None:
    if not d.types:
        return None
    try:
        schema = onnx.defs.get_schema(node.op_type, node.opset, node.domain)
    except Exception:
        return None
    formal = list(schema.inputs)
    for i in range(len(node.inputs)):
        if not formal:
            break
        param = formal[min(i, len(formal) - 1)]
        allowed = d.types.get(param.type_str)
        if allowed is None:
            continue
        dt = node.input_dtype(i)
        if dt is not None and dt not in allowed:
            names = ", ".join(sorted(str(a) for a in allowed))
            return f"input {i} has type {dt}; this kernel takes {param.type_str} in {{{names}}}"
    return None


def decode_attribute(attr: AttributeProto, make_subgraph: Callable | None = None) -> Any:
    """Turn an ``AttributeProto`` into a plain Python value.

    Strings become ``str`` (decoded as UTF-8), tensors numpy arrays, and graphs
    whatever ``make_subgraph(graph_proto)`` returns (the raw ``GraphProto`` if none).
    """
    t = attr.type
    A = AttributeProto
    if t == A.FLOAT:
        return float(attr.f)
    if t == A.INT:
        return int(attr.i)
    if t == A.STRING:
        return _decode_str(attr.s)
    if t == A.TENSOR:
        return numpy_helper.to_array(attr.t)
    if t == A.GRAPH:
        return make_subgraph(attr.g) if make_subgraph else attr.g
    if t == A.SPARSE_TENSOR:
        return attr.sparse_tensor
    if t == A.TYPE_PROTO:
        return attr.tp
    if t == A.FLOATS:
        return [float(x) for x in attr.floats]
    if t == A.INTS:
        return [int(x) for x in attr.ints]
    if t == A.STRINGS:
        return [_decode_str(s) for s in attr.strings]
    if t == A.TENSORS:
        return [numpy_helper.to_array(x) for x in attr.tensors]
    if t == A.GRAPHS:
        return [make_subgraph(g) if make_subgraph else g for g in attr.graphs]
    if t == A.SPARSE_TENSORS:
        return list(attr.sparse_tensors)
    if t == A.TYPE_PROTOS:
        return list(attr.type_protos)
    raise ValueError(f"attribute {attr.name!r} has unknown type {t}")


def _decode_str(b: bytes) -> str:
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return b.decode("latin-1")
