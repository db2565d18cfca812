"""Memoized shape computations.

Exported models recompute their reshape targets on every run: ``Shape -> Gather ->
Unsqueeze -> Concat -> Reshape``, attention's ``sqrt(head_size)`` from
``Shape -> Gather -> Div -> Cast -> Pow``, position ids sliced to the sequence length.
A transformer encoder exported by torch spends 30 of its 86 nodes on them. Their
results depend only on the shapes of a few tensors, so a plan runs each such chain
once per shape and afterwards hands back what it computed then.

What is memoized: a *segment*, a ``Shape`` or ``Size`` step (the leaf) and every
later step of the default domain, from :data:`PURE_OPS`, whose inputs are all
constants or outputs of such steps and that depends on no later leaf. The segment
moves to the leaf's place in the plan (every one of its steps only moves earlier,
which keeps the order topological) and runs there as one step. Its key is the shape
of the leaf's input and the values of its other non-constant inputs (outputs of
earlier segments, a few integers each). A segment without a leaf, whose inputs are
all constants (only left where the optimizer did not fold them), runs once.

Safety: the cached arrays are read-only views, which the session copies before
handing one to a caller (as it does for constants); a segment whose outputs are not
all host arrays of at most :data:`MAX_BYTES` in total stops memoizing and runs its
steps every time; at most :data:`MAX_KEYS` shapes are kept per segment (the table
starts again when it is full). Profiled runs and runs with ``RunOptions`` run every
node (the checked variant of the generated code, :attr:`Plan.checked_code
<onnxrt.plan.codegen.Plan.checked_code>`). A segment's steps are compiled by the same
generator as whole plans, on its first miss. ``session.memoize_shapes`` set to ``0`` turns
memoization off.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

import numpy as np

from .codegen import compile_steps

__all__ = ["CONFIG_KEY", "LEAVES", "PURE_OPS", "MAX_BYTES", "MAX_KEYS", "ShapeSegment", "memoized_steps"]

#: Session config entry: ``0`` turns shape memoization off.
CONFIG_KEY = "session.memoize_shapes"

#: Steps whose output depends on their input's shape only.
LEAVES = frozenset({"Shape", "Size"})

#: Deterministic default-domain ops that shape computations are made of.
PURE_OPS = frozenset({
    "Abs", "Add", "And", "Cast", "CastLike", "Ceil", "Clip", "Concat", "ConstantOfShape", "Div",
    "Equal", "Expand", "Flatten", "Floor", "Gather", "GatherElements", "GatherND", "Greater",
    "GreaterOrEqual", "Identity", "Less", "LessOrEqual", "Max", "Min", "Mod", "Mul", "Neg", "Not",
    "Or", "Pow", "Range", "Reciprocal", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceSum",
    "Reshape", "Sign", "Slice", "Split", "Sqrt", "Squeeze", "Sub", "Sum", "Tile", "Transpose",
    "Unsqueeze", "Where",
})

#: Most bytes one key's outputs may hold; a segment producing more is not memoized.
MAX_BYTES = 1 << 20

#: Shapes remembered per segment.
MAX_KEYS = 16


class ShapeSegment:
    """A leaf step and the pure steps after it, called as one step: ``seg(*ins)``
    returns the values of :attr:`outs`, from the cache when the key was seen before."""

    def __init__(self, leaf, steps: list, ins: tuple[int, ...], outs: tuple[int, ...], keyed: tuple):
        self.leaf = leaf
        self.steps = tuple(steps)
        self.ins = ins
        self.outs = outs
        #: (position in ``ins``, True for the leaf's input: its shape, else its value)
        self.keyed = keyed
        self.cache: dict[tuple, tuple] = {}
        self.enabled = True
        #: the steps compiled to one function of ``ins`` (on the first miss), by the
        #: same generator as whole plans
        self._run = None
        self._lock = threading.Lock()

    def _key(self, args) -> tuple | None:
        parts = []
        for pos, is_leaf_input in self.keyed:
            v = args[pos]
            if is_leaf_input:
                shape = getattr(v, "shape", None)
                if shape is None:
                    return None
                parts.append(tuple(shape))
            elif isinstance(v, np.ndarray):
                parts.append((v.dtype.str, v.shape, v.tobytes()))
            else:
                return None
        return tuple(parts)

    def __call__(self, *args) -> tuple:
        key = self._key(args) if self.enabled else None
        if key is not None:
            hit = self.cache.get(key)
            if hit is not None:
                return hit
        run = self._run or self._compile()
        result = run(*args)
        if key is not None:
            result = self._store(key, result)
        return result

    @property
    def code(self) -> str:
        """The generated source of the segment's steps."""
        return (self._run or self._compile()).__onnxrt_source__

    def _compile(self):
        with self._lock:
            if self._run is None:
                self._run = compile_steps(self.steps, self.ins, self.outs, {}, "shape segment")
        return self._run

    def _store(self, key: tuple, result: tuple) -> tuple:
        if not all(isinstance(v, np.ndarray) for v in result) or sum(v.nbytes for v in result) > MAX_BYTES:
            self.enabled = False
            self.cache.clear()
            return result
        frozen = []
        for v in result:
            # a view of its own, so that the flag does not change an array held elsewhere
            r = v.view()
            r.flags.writeable = False
            frozen.append(r)
        frozen = tuple(frozen)
        if len(self.cache) >= MAX_KEYS:
            self.cache.clear()
        self.cache[key] = frozen
        return frozen


def memoized_steps(steps: list, const_slots: set[int], kept_slots: set[int], none_slot: int, step_cls) -> list | None:
    """``steps`` with each memoizable segment replaced by one step calling a
    :class:`ShapeSegment` (the other steps copied), or None if there is none. ``const_slots`` hold
    values that no feed can change; ``kept_slots`` are read after the last step (the
    graph's outputs). Free lists are left for the caller to compute."""
    producer: dict[int, int] = {}
    seg_of: dict[int, int] = {}  # step index -> its segment's anchor (leaf index, or -1)
    for i, st in enumerate(steps):
        pure = not st.is_copy and not st.implicit and st.host and st.domain in ("", "ai.onnx")
        if pure and st.op_type in LEAVES and len(st.ins) == 1:
            seg_of[i] = i
        elif pure and st.op_type in PURE_OPS:
            anchors = []
            for s in st.ins:
                if s in const_slots or s == none_slot:
                    continue
                p = producer.get(s)
                if p is None or p not in seg_of:
                    anchors = None
                    break
                anchors.append(seg_of[p])
            if anchors is not None:
                seg_of[i] = max(anchors, default=-1)
        for s in st.outs:
            producer[s] = i
    members: dict[int, list[int]] = {}
    for i, a in seg_of.items():
        members.setdefault(a, []).append(i)
    # a leaf with no pure step after it stays a plain step: a Shape on its own gains
    # nothing from a cache
    for a in [a for a, idx in members.items() if idx == [a]]:
        del members[a]
        del seg_of[a]
    if not members:
        return None
    # every slot read outside a segment, or after the last step
    read_by: dict[int, set] = {}
    for i, st in enumerate(steps):
        for s in list(st.ins) + [s for _, s in st.implicit]:
            read_by.setdefault(s, set()).add(seg_of.get(i, ("step", i)))
    segments: dict[int, Any] = {}
    for a, idx in members.items():
        idx.sort()
        # copies that free nothing: the plan's free lists follow its own order, and a
        # value last read by a step that moved into the segment may be read after it
        subs = [replace(steps[i], free=()) for i in idx]
        made = {s for st in subs for s in st.outs}
        ins: list[int] = []
        for st in subs:
            for s in st.ins:
                if s not in made and s not in ins:
                    ins.append(s)
        outs = tuple(sorted(s for s in made if s in kept_slots or any(r != a for r in read_by.get(s, ()))))
        leaf = steps[a] if a >= 0 else None
        # the leaf's input keys by its shape, unless a pure step also reads its value
        shape_only = leaf is not None and not any(leaf.ins[0] in st.ins for st in subs[1:])
        keyed = tuple(
            (pos, shape_only and s == leaf.ins[0])
            for pos, s in enumerate(ins)
            if s not in const_slots and s != none_slot
        )
        seg = ShapeSegment(leaf, subs, tuple(ins), outs, keyed)
        names = ", ".join(st.node_name for st in subs)
        segments[a] = step_cls(
            seg, tuple(ins), outs, (), f"shape segment [{names}]", "ShapeSegment",
            subs[0].provider, output_names=(),
        )
    out = [segments[-1]] if -1 in segments else []
    for i, st in enumerate(steps):
        a = seg_of.get(i)
        if a is None:
            out.append(replace(st))  # a copy: its free list is the new plan's
        elif a == i:
            out.append(segments[a])
    return out
