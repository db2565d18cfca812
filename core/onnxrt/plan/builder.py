"""The execution plan: ordered steps over integer value slots, and the loop that runs it.

Built once per (sub)graph and immutable afterwards. Every value gets a slot; each
step lists the slots it reads, the slots it writes and the slots whose values are
dead after it (freed at once, so peak memory follows the live set). A copy step is
inserted wherever a value crosses from one device to another. A run keeps all its
state in a local list, so many threads may run one plan at once.
"""

from __future__ import annotations

import time
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..errors import Fail, InvalidArgument, OnnxRtError, RuntimeException
from ..run.limits import _limit
from .shape_memo import memoized_steps

__all__ = ["Step", "Plan", "PlanBuilder", "RunContext"]

_NONE_SLOT = 0  # always holds None: absent optional inputs read it
_DISCARD_SLOT = 1  # unused optional outputs are written here and dropped


@dataclass
class Step:
    """One call in the plan: a kernel (or a copy) with its slots."""

    fn: Callable
    ins: tuple[int, ...]
    outs: tuple[int, ...]
    free: tuple[int, ...]
    node_name: str
    op_type: str
    provider: str
    implicit: tuple[tuple[str, int], ...] = ()
    is_copy: bool = False
    output_names: tuple[str, ...] = ()
    #: copy steps: the devices the value moves between (device-resident IOBinding reads them)
    src_device: Any = None
    dst_device: Any = None
    #: the node's operator domain, and whether its outputs live in host memory
    domain: str = ""
    host: bool = True


class RunContext:
    """Per-run settings the loop consults: termination and profiling."""

    __slots__ = ("run_options", "profiler")

    def __init__(self, run_options=None, profiler=None):
        self.run_options = run_options
        self.profiler = profiler


class Plan:
    """An immutable list of steps over slots, and the loop that runs it."""

    def __init__(
        self,
        steps: list[Step],
        n_slots: int,
        input_slots: dict[str, int],
        outer_slots: dict[str, int],
        output_slots: list[int],
        constants: dict[int, Any],
        max_bytes: int,
        fast_steps: list[Step] | None = None,
        scopes: tuple = (),
    ):
        self.steps = tuple(steps)
        #: the devices whose ``run_scope`` is entered around each run
        self.scopes = tuple(scopes)
        #: what an unchecked run executes: :attr:`steps` with shape computations
        #: memoized (:mod:`onnxrt.shape_memo`); profiled and checked runs take every step
        self.fast_steps = tuple(fast_steps) if fast_steps is not None else self.steps
        self.n_slots = n_slots
        self.input_slots = input_slots
        self.outer_slots = outer_slots
        self.output_slots = tuple(output_slots)
        template: list[Any] = [None] * n_slots
        for s, v in constants.items():
            template[s] = v
        self._template = template
        self._const_slots = frozenset(constants)
        self.max_bytes = max_bytes

    def run(self, feeds: dict[str, Any], outer: dict[str, Any] | None = None, ctx: RunContext | None = None) -> list:
        """Run with ``feeds`` (input name -> value) and return the outputs in order."""
        vals = list(self._template)
        for name, slot in self.input_slots.items():
            if name in feeds:
                vals[slot] = feeds[name]
        if outer:
            for name, slot in self.outer_slots.items():
                vals[slot] = outer[name]
        # kernels read the cap through onnxrt.run.limits.check_allocation
        token = _limit.set(self.max_bytes) if _limit.get() != self.max_bytes else None
        # Floating-point overflow, division by zero and invalid operations give inf
        # and NaN as the ONNX ops define, never a warning: one numpy error state per
        # run (it is per thread) spares every elementwise kernel its own.
        try:
            with np.errstate(all="ignore"), (_entered(self.scopes) if self.scopes else _NO_SCOPE):
                if ctx is None or (ctx.run_options is None and ctx.profiler is None):
                    self._loop(vals, ctx)
                else:
                    self._loop_checked(vals, ctx)
        finally:
            if token is not None:
                _limit.reset(token)
        return [vals[s] for s in self.output_slots]

    def _loop(self, vals: list, ctx) -> None:
        run_steps(self.fast_steps, vals, ctx)

    def _loop_checked(self, vals: list, ctx: RunContext) -> None:
        ro = ctx.run_options
        prof = ctx.profiler
        for step in self.steps:
            if ro is not None and ro.terminate:
                raise RuntimeException(
                    f"the run was terminated (RunOptions.terminate) before node {step.node_name!r}"
                )
            t0 = time.perf_counter_ns() if prof is not None else 0
            try:
                if step.implicit:
                    outs = step.fn(*[vals[i] for i in step.ins], outer={n: vals[s] for n, s in step.implicit}, ctx=ctx)
                else:
                    outs = step.fn(*[vals[i] for i in step.ins])
            except BaseException as e:  # noqa: BLE001
                raise _wrap(e, step) from e
            for s, v in zip(step.outs, outs):
                vals[s] = v
            if prof is not None:
                prof.node_event(step, t0, time.perf_counter_ns(), [vals[s] for s in step.outs])
            for s in step.free:
                vals[s] = None


def run_steps(steps, vals: list, ctx=None) -> None:
    """Run ``steps`` over the slot list ``vals``: each reads its input slots, writes its
    output slots and clears the slots dead after it (the unchecked run loop)."""
    for step in steps:
        try:
            if step.implicit:
                outs = step.fn(*[vals[i] for i in step.ins], outer={n: vals[s] for n, s in step.implicit}, ctx=ctx)
            else:
                outs = step.fn(*[vals[i] for i in step.ins])
        except BaseException as e:  # noqa: BLE001 - re-raised with the node named
            raise _wrap(e, step) from e
        for s, v in zip(step.outs, outs):
            vals[s] = v
        for s in step.free:
            vals[s] = None


def _wrap(e: BaseException, step: Step) -> BaseException:
    if isinstance(e, (KeyboardInterrupt, SystemExit)):
        return e
    if isinstance(e, RuntimeException):
        return e
    what = "copying a value between devices" if step.is_copy else f"running {step.op_type} node {step.node_name!r}"
    if isinstance(e, MemoryError):
        return Fail(f"out of memory {what} on {step.provider}: {e}")
    if isinstance(e, OnnxRtError) and f"node {step.node_name!r}" in str(e):
        return e
    msg = f"{what} on {step.provider}: {type(e).__name__}: {e}"
    if isinstance(e, (InvalidArgument, IndexError)):
        # out-of-range indices come from the feed: onnxruntime's INVALID_ARGUMENT
        return InvalidArgument(msg)
    return Fail(msg)


@dataclass
class _Val:
    slot: int
    device: Any  # the Device the value lives on


class PlanBuilder:
    """Assigns slots, inserts copies and computes last uses, then makes a :class:`Plan`."""

    def __init__(self, host_device, max_bytes: int, memoize_shapes: bool = True):
        self.host = host_device
        self.max_bytes = max_bytes
        self.memoize_shapes = memoize_shapes
        self.n_slots = 2
        self.vals: dict[str, _Val] = {}
        self.copies: dict[tuple[str, int], int] = {}
        self.steps: list[Step] = []
        self.input_slots: dict[str, int] = {}
        self.outer_slots: dict[str, int] = {}
        self.constants: dict[int, Any] = {}
        self.pinned: set[int] = set()
        self.scopes: list = []

    def _new_slot(self) -> int:
        s = self.n_slots
        self.n_slots += 1
        return s

    def add_input(self, name: str) -> None:
        """A graph input (host)."""
        s = self._new_slot()
        self.vals[name] = _Val(s, self.host)
        self.input_slots[name] = s

    def add_outer(self, name: str) -> None:
        """An outer-scope value a subgraph reads (host)."""
        s = self._new_slot()
        self.vals[name] = _Val(s, self.host)
        self.outer_slots[name] = s

    def add_constant(self, name: str, value: Any, overridable: bool) -> None:
        """An initializer; overridable ones are also inputs."""
        if name in self.vals:
            s = self.vals[name].slot
        else:
            s = self._new_slot()
            self.vals[name] = _Val(s, self.host)
        self.constants[s] = value
        if overridable:
            self.input_slots[name] = s

    def _read(self, name: str, device, shape_only: bool = False) -> int:
        if not name:
            return _NONE_SLOT
        v = self.vals.get(name)
        if v is None:
            raise InvalidArgument(f"value {name!r} is read before it is produced")
        if _same_memory(v.device, device):
            return v.slot
        if shape_only and device.is_host:
            key = (name, "shape")
            s = self.copies.get(key)
            if s is None:
                s = self._new_slot()
                self.steps.append(shape_step(v.slot, s, name, v.device))
                self.copies[key] = s
            return s
        key = (name, id(device))
        s = self.copies.get(key)
        if s is None:
            s = self._new_slot()
            src, dst = v.device, device
            if src.is_host:
                fn = _copy_fn(dst.from_host)
            elif dst.is_host:
                fn = _copy_fn(src.to_host)
            else:
                fn = _copy_fn(lambda x, a=src, b=dst: b.from_host(a.to_host(x)))
            self.steps.append(
                Step(fn, (v.slot,), (s,), (), f"copy:{name}", "MemcpyToHost" if dst.is_host else "MemcpyFromHost",
                     f"{src.kind}->{dst.kind}", is_copy=True, output_names=(name,), src_device=src, dst_device=dst)
            )
            self.copies[key] = s
        return s

    def add_step(self, fn, inputs, outputs, device, node_name, op_type, provider, implicit=(), domain="",
                 host_inputs=frozenset()) -> None:
        """A kernel call on ``device``; its outputs live there, and it reads the inputs at
        positions ``host_inputs`` on the host."""
        shape_only = reads_shape_only(op_type, domain)
        if getattr(device, "run_scope", None) is not None and device not in self.scopes:
            self.scopes.append(device)
        ins = tuple(self._read(i, self.host if k in host_inputs else device, shape_only and k == 0)
                    for k, i in enumerate(inputs))
        imp = tuple((n, self._read(n, self.host)) for n in implicit)
        outs = []
        for o in outputs:
            if not o:
                outs.append(_DISCARD_SLOT)
                continue
            s = self._new_slot()
            self.vals[o] = _Val(s, device)
            outs.append(s)
        self.steps.append(Step(fn, ins, tuple(outs), (), node_name, op_type, provider, imp,
                               output_names=tuple(outputs), domain=domain, host=bool(device.is_host)))

    def build(self, output_names: list[str]) -> Plan:
        """Finish: outputs are read on the host; every other value is freed after its last use."""
        out_slots = []
        for o in output_names:
            out_slots.append(self._read(o, self.host))
        keep = set(out_slots) | set(self.constants) | {_NONE_SLOT}
        _set_frees(self.steps, keep)
        fast = None
        if self.memoize_shapes:
            fixed = set(self.constants) - set(self.input_slots.values())
            fast = memoized_steps(self.steps, fixed, set(out_slots), _NONE_SLOT, Step)
            if fast is not None:
                _set_frees(fast, keep)
        return Plan(self.steps, self.n_slots, self.input_slots, self.outer_slots, out_slots,
                    self.constants, self.max_bytes, fast, self.scopes)


def _set_frees(steps: list[Step], keep: set[int]) -> None:
    """Give each step the slots whose values are dead after it."""
    last_use: dict[int, int] = {}
    for idx, st in enumerate(steps):
        for s in st.ins:
            last_use[s] = idx
        for _, s in st.implicit:
            last_use[s] = idx
        for s in st.outs:
            last_use.setdefault(s, idx)
            if s == _DISCARD_SLOT:
                last_use[s] = idx
    frees: list[list[int]] = [[] for _ in steps]
    for s, idx in last_use.items():
        if s not in keep:
            frees[idx].append(s)
    for st, fr in zip(steps, frees):
        st.free = tuple(sorted(set(fr)))


def _same_memory(a, b) -> bool:
    if a is b:
        return True
    return a.is_host and b.is_host


#: ops that read only the shape of their (first) input: a host one reads a device value
#: through :func:`shape_stand_in`, with no copy of the data
SHAPE_READERS = frozenset({"Shape", "Size"})


def reads_shape_only(op_type: str, domain: str) -> bool:
    """Whether a node reads only its first input's shape (default-domain Shape, Size)."""
    return op_type in SHAPE_READERS and not domain


def shape_stand_in(value) -> np.ndarray:
    """A host array with ``value``'s shape and dtype and no memory behind it (every element
    is the one zero), for kernels that read only shapes."""
    z = np.zeros(1, dtype=np.dtype(value.dtype))
    return np.lib.stride_tricks.as_strided(z, shape=tuple(value.shape), strides=(0,) * len(value.shape))


def shape_step(src: int, dst: int, name: str, device) -> Step:
    """The step handing a host Shape or Size the stand-in of device value ``name``
    (slot ``src``) in slot ``dst``: its shape, not a copy of its data."""
    return Step(_copy_fn(shape_stand_in), (src,), (dst,), (), f"shape:{name}", "ShapeToHost",
                f"{device.kind}->cpu", output_names=(name,), host=True)


#: what a run of a plan without device scopes enters (reusable, unlike an ExitStack)
_NO_SCOPE = nullcontext()


def _entered(devices) -> ExitStack:
    """The ``run_scope()`` of each of ``devices``, entered (those already entered are
    left again if a later one fails)."""
    with ExitStack() as stack:
        for dev in devices:
            stack.enter_context(dev.run_scope())
        return stack.pop_all()


def _copy_fn(f):
    def copy(x):
        if isinstance(x, list):
            return ([f(v) for v in x],)
        if x is None:
            return (None,)
        return (f(x),)

    return copy


def array_root(a):
    """The array owning ``a``'s memory (follows ``.base``)."""
    while isinstance(a, np.ndarray) and a.base is not None:
        a = a.base
    return a


def caller_owned(v: np.ndarray, *protected: set) -> np.ndarray:
    """The output array ``v`` as a run hands it to its caller: copied when its memory
    is in one of the ``protected`` sets of root ids (feeds, constants, outputs already
    handed out) or read-only (memory a kernel keeps), and when it is a view in another
    layout (a Transpose's, a channels-last convolution's): onnxruntime returns
    C-ordered arrays, and callers handing them to C code expect as much."""
    r = id(array_root(v))
    if not v.flags.writeable or not v.flags.c_contiguous or any(r in p for p in protected):
        return v.copy()
    return v
