"""Control flow: If, Loop, Scan and SequenceMap.

Their bodies arrive as compiled :class:`onnxrt.session.Subgraph` objects in the
attributes; the values the bodies read from the enclosing scope arrive as
``outer=`` when the node runs, and are passed straight through to the body.
"""

from __future__ import annotations

import numpy as np

from onnxrt.compile.compiler import Subgraph
from onnxrt.dtypes import np_dtype
from onnxrt.plugin.kernel import Kernel
from onnxrt.run.limits import check_allocation

from ..registry import op


#: the feed of a plan with no inputs (an If branch's): read, never written
_NO_FEEDS: dict = {}


def _output_dtype(body, i: int, fallback=np.float32):
    vi = body.graph.outputs[i]
    tp = vi.type
    if tp.HasField("tensor_type") and tp.tensor_type.elem_type:
        return np_dtype(tp.tensor_type.elem_type)
    return np.dtype(fallback)


def _output_rank_shape(body, i: int):
    tp = body.graph.outputs[i].type
    if tp.HasField("tensor_type") and tp.tensor_type.HasField("shape"):
        return [d.dim_value if d.HasField("dim_value") else 0 for d in tp.tensor_type.shape.dim]
    return None


def _declared_dtype(body, i: int):
    """The element type body output ``i`` declares, or None."""
    if i >= len(body.graph.outputs):
        return None
    tp = body.graph.outputs[i].type
    if tp.HasField("tensor_type") and tp.tensor_type.elem_type:
        try:
            return np_dtype(tp.tensor_type.elem_type)
        except TypeError:
            return None
    return None


def _describe(v) -> str:
    if isinstance(v, np.ndarray):
        return f"a tensor of {v.dtype}"
    if isinstance(v, list):
        return "a sequence"
    return "an empty optional" if v is None else type(v).__name__


def _same_kind(a, b) -> bool:
    """Whether ``b`` can stand where ``a`` stood: both tensors of one dtype, both
    sequences, or either an empty optional."""
    if a is None or b is None:
        return True
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return a.dtype == b.dtype
    return isinstance(a, list) == isinstance(b, list) and isinstance(a, np.ndarray) == isinstance(b, np.ndarray)


@op("If", since=1)
class If(Kernel):
    """Runs ``then_branch`` or ``else_branch``."""

    def setup(self):
        self.then_branch = self.attrs["then_branch"]
        self.else_branch = self.attrs["else_branch"]
        n = len(self.node.outputs)
        # what either branch declares, each output: the branch that runs must return it
        self.want = [_declared_dtype(self.then_branch, i) or _declared_dtype(self.else_branch, i)
                     for i in range(n)]
        self.n_out = n
        self.checks = tuple((i, w) for i, w in enumerate(self.want) if w is not None)
        # the branches' plans, called directly: a branch has no inputs of its own, only
        # the outer-scope values (a Subgraph's call would build its empty feed dict first)
        branches = (self.then_branch, self.else_branch)
        direct = all(isinstance(b, Subgraph) and type(b).__call__ is Subgraph.__call__ and not b.input_names
                     for b in branches)
        self.plans = tuple(b.plan for b in branches) if direct else None

    def run(self, cond, outer=None, ctx=None):
        if type(cond) is np.ndarray and cond.size == 1:
            taken = bool(cond.item())
        else:
            c = np.asarray(cond)
            if c.size != 1:
                raise ValueError(f"If condition must hold one element, got shape {list(c.shape)}")
            taken = bool(c.reshape(-1)[0])
        plans = self.plans
        if plans is not None:
            outs = plans[0 if taken else 1].run(_NO_FEEDS, outer, ctx)
        else:
            outs = (self.then_branch if taken else self.else_branch)(outer=outer, ctx=ctx)
        if len(outs) != self.n_out:
            raise ValueError(f"{self.node.describe()}: the {'then' if taken else 'else'} branch returned "
                             f"{len(outs)} values for {self.n_out} outputs")
        if self.n_out == 1 and self.checks:
            # the common If: one output, declared (no loop; a dtype is most often the
            # declared one itself)
            v = outs[0]
            if isinstance(v, np.ndarray) and v.dtype is not self.want[0] and v.dtype != self.want[0]:
                self._wrong_dtype(taken, 0, v)
            return outs
        for i, want in self.checks:
            v = outs[i]
            if isinstance(v, np.ndarray) and v.dtype != want:
                self._wrong_dtype(taken, i, v)
        return outs

    def _wrong_dtype(self, taken: bool, i: int, v: np.ndarray):
        raise TypeError(f"{self.node.describe()}: the {'then' if taken else 'else'} branch returned "
                        f"{v.dtype} for output {i}, which the branches declare as {self.want[i]}")


@op("Loop", since=1)
class Loop(Kernel):
    """A loop with a trip count and/or a condition, carried values and scan outputs."""

    def setup(self):
        self.body = self.attrs["body"]
        n_body_in = len(self.body.input_names)
        self.n_carried = n_body_in - 2
        self.n_scan = len(self.body.output_names) - 1 - self.n_carried

    def run(self, M=None, cond=None, *carried, outer=None, ctx=None):
        max_trip = None if M is None else int(np.asarray(M).reshape(-1)[0])
        keep_going = True if cond is None else bool(np.asarray(cond).reshape(-1)[0])
        values = list(carried)
        scans: list[list] = [[] for _ in range(self.n_scan)]
        i = 0
        ro = getattr(ctx, "run_options", None)
        while keep_going and (max_trip is None or i < max_trip):
            if ro is not None and ro.terminate:
                from onnxrt.errors import RuntimeException

                raise RuntimeException("the run was terminated (RunOptions.terminate) inside a Loop")
            outs = self.body(np.array(i, dtype=np.int64), np.array(keep_going), *values, outer=outer, ctx=ctx)
            if len(outs) < 1 + self.n_carried + self.n_scan:
                raise ValueError(f"{self.node.describe()}: the body returned {len(outs)} values, expected "
                                 f"{1 + self.n_carried + self.n_scan}")
            keep_going = bool(np.asarray(outs[0]).reshape(-1)[0])
            new = outs[1 : 1 + self.n_carried]
            for j, (old, v) in enumerate(zip(values, new)):
                if not _same_kind(old, v):
                    # the body's next iteration, and the node's consumers, were typed for the first
                    raise TypeError(f"{self.node.describe()}: carried value {j} entered iteration {i} as "
                                    f"{_describe(old)} and left it as {_describe(v)}")
            values = list(new)
            for k in range(self.n_scan):
                s = outs[1 + self.n_carried + k]
                scans[k].append(s)
                if not isinstance(s, list):
                    # the stacked scan output grows with every iteration, and a fed trip
                    # count can make it unbounded: hold it to the allocation cap as it grows
                    s = np.asarray(s)
                    check_allocation((len(scans[k]),) + s.shape, s.dtype, f"Loop scan output {k}")
            i += 1
        results = list(values)
        for k in range(self.n_scan):
            if scans[k]:
                if isinstance(scans[k][0], list):
                    results.append(scans[k])
                else:
                    results.append(np.stack([np.asarray(s) for s in scans[k]]))
            else:
                shape = _output_rank_shape(self.body, 1 + self.n_carried + k)
                dt = _output_dtype(self.body, 1 + self.n_carried + k)
                results.append(np.empty([0] + (shape or []), dtype=dt))
        return results


@op("Scan", since=8, end=8)
class Scan8(Kernel):
    """Scan, opset 8: a leading batch axis and optional sequence lengths."""

    def setup(self):
        self.body = self.attrs["body"]
        self.n_scan_in = self.attrs["num_scan_inputs"]
        self.directions = self.attrs.get("directions", [0] * self.n_scan_in)

    def run(self, sequence_lens=None, *inputs, outer=None, ctx=None):
        n_state = len(inputs) - self.n_scan_in
        states = inputs[:n_state]
        scans = inputs[n_state:]
        batch = (states[0] if states else scans[0]).shape[0]
        per_batch = []
        for b in range(batch):
            st = [s[b] for s in states]
            sc = [s[b] for s in scans]
            length = sc[0].shape[0] if sequence_lens is None else int(sequence_lens[b])
            outs_s = []
            for t in range(length):
                args = [x[length - 1 - t] if self.directions[j] else x[t] for j, x in enumerate(sc)]
                out = self.body(*st, *args, outer=outer, ctx=ctx)
                st = out[:n_state]
                outs_s.append(out[n_state:])
            per_batch.append((st, outs_s))
        n_out_scan = len(self.body.output_names) - n_state
        res = [np.stack([pb[0][k] for pb in per_batch]) for k in range(n_state)]
        for k in range(n_out_scan):
            res.append(np.stack([np.stack([o[k] for o in pb[1]]) for pb in per_batch]))
        return res


@op("Scan", since=9)
class Scan(Kernel):
    """Scan, opset 9 and later: scan axes and directions per input and output."""

    def setup(self):
        self.body = self.attrs["body"]
        self.n_scan_in = self.attrs["num_scan_inputs"]
        a = self.attrs
        self.in_axes = a.get("scan_input_axes", [0] * self.n_scan_in)
        self.in_dirs = a.get("scan_input_directions", [0] * self.n_scan_in)
        self.n_state = len(self.body.input_names) - self.n_scan_in
        n_out_scan = len(self.body.output_names) - self.n_state
        self.out_axes = a.get("scan_output_axes", [0] * n_out_scan)
        self.out_dirs = a.get("scan_output_directions", [0] * n_out_scan)

    def run(self, *inputs, outer=None, ctx=None):
        n_state = self.n_state
        states = list(inputs[:n_state])
        scans = []
        for j, x in enumerate(inputs[n_state:]):
            ax = self.in_axes[j] % x.ndim if x.ndim else 0
            x = np.moveaxis(x, ax, 0)
            if self.in_dirs[j]:
                x = x[::-1]
            scans.append(x)
        length = scans[0].shape[0] if scans else 0
        for j, x in enumerate(scans):
            if x.shape[0] != length:
                raise ValueError(f"Scan input {n_state + j} has {x.shape[0]} steps, expected {length}")
        collected: list[list] = [[] for _ in self.out_axes]
        n_out = n_state + len(self.out_axes)
        for t in range(length):
            out = self.body(*states, *[x[t] for x in scans], outer=outer, ctx=ctx)
            if len(out) != n_out:
                raise ValueError(f"{self.node.describe()}: the body returned {len(out)} values, expected {n_out}")
            for j, (old, v) in enumerate(zip(states, out[:n_state])):
                if not _same_kind(old, v):
                    raise TypeError(f"{self.node.describe()}: state {j} entered step {t} as {_describe(old)} "
                                    f"and left it as {_describe(v)}")
            states = list(out[:n_state])
            for k, v in enumerate(out[n_state:]):
                collected[k].append(v)
        results = states
        for k, vals in enumerate(collected):
            if vals:
                y = np.stack(vals)
            else:
                y = np.empty([0] + (_output_rank_shape(self.body, n_state + k) or []),
                             dtype=_output_dtype(self.body, n_state + k))
            if self.out_dirs[k]:
                y = y[::-1]
            ax = self.out_axes[k]
            if ax:
                y = np.moveaxis(y, 0, ax % y.ndim)
            results.append(np.ascontiguousarray(y))
        return results


@op("SequenceMap", since=17)
class SequenceMap(Kernel):
    """Applies the body to each element of the input sequence(s)."""

    def setup(self):
        self.body = self.attrs["body"]

    def run(self, seq, *extra, outer=None, ctx=None):
        n = len(seq)
        for j, e in enumerate(extra):
            if isinstance(e, list) and len(e) != n:
                raise ValueError(f"SequenceMap: input {j + 1} has {len(e)} elements, expected {n}")
        outs: list[list] = [[] for _ in self.body.output_names]
        for i in range(n):
            args = [seq[i]] + [e[i] if isinstance(e, list) else e for e in extra]
            res = self.body(*args, outer=outer, ctx=ctx)
            for k, v in enumerate(res):
                outs[k].append(v)
        return outs
