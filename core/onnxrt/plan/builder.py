"""Building a plan: ordered steps over integer value slots.

Built once per (sub)graph and immutable afterwards. Every value gets a slot; each
step lists the slots it reads, the slots it writes and the slots whose values are
dead after it (dropped at once, so peak memory follows the live set). A copy step is
inserted wherever a value crosses from one device to another. The plan runs as
generated Python (:mod:`onnxrt.plan.codegen`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..errors import InvalidArgument
from ..plugin.provider import device_scope
from .codegen import _DISCARD_SLOT, _NONE_SLOT, Plan
from .shape_memo import memoized_steps

__all__ = ["Step", "PlanBuilder", "SHAPE_READERS", "reads_shape_only", "shape_stand_in", "shape_step",
           "array_root", "caller_owned"]


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
        self.scopes: list = []
        #: devices constants were uploaded to, synchronized once the plan is built
        self.uploaded: list = []

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
        if s is None and v.device.is_host and v.slot in self.constants and name not in self.input_slots:
            # a constant (not one a feed may override) is uploaded once, here, and the
            # device copy is a constant of the plan too
            s = self._new_slot()
            with device_scope(device):
                self.constants[s] = device.from_host(self.constants[v.slot])
            self.uploaded.append(device)
            self.copies[key] = s
            return s
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
        for device in {id(d): d for d in self.uploaded}.values():
            with device_scope(device):
                device.synchronize()  # runs on other threads read the constants on their own streams
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


def _copy_fn(f):
    """A copy step's function: ``f`` applied to a value (to each tensor of a sequence),
    returning the one output in a tuple as kernels do; its ``value_fn`` returns the
    value itself, which is what the generated code calls."""

    def value(x):
        if isinstance(x, list):
            return [f(v) for v in x]
        if x is None:
            return None
        return f(x)

    def copy(x):
        return (value(x),)

    copy.value_fn = value
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
