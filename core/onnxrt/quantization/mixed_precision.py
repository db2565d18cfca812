"""Automatic mixed precision: float16 everywhere except the nodes whose float16 error
is beyond a tolerance, which stay float32.

Given feeds, the float32 model runs once with every node output exposed, as the
reference. Then, repeatedly: convert to float16 with the nodes kept so far blocked,
run with every node output exposed, and walk the nodes in topological order for the
first whose outputs differ from the reference beyond ``rtol``/``atol`` (the bisection
``onnxrt compare`` does, with its tolerance rule: ``|a - b| <= atol * max(1, max|b|) +
rtol * |b|``). That node is kept in float32 and the loop goes on until every model
output agrees (and ``validate_fn``, when given, accepts them). When the first
differing node is one already kept in float32, its float16 inputs' error is what it
amplifies, so the float16 nodes that produce those inputs are kept next; when no
single node differs but the outputs do (error accumulated along the way), the node
with the largest error relative to its tolerance is kept. Every kept node is reported
with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import onnx

from ..errors import InvalidArgument
from .float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16, float16_plan
from ..ir.proto_edits import expose_all_outputs, name_nodes
from .graph import load_input_model

__all__ = ["KeptNode", "MixedPrecisionReport", "auto_mixed_precision", "auto_convert_mixed_precision"]

FLOAT16_MAX = 65504.0
DEFAULT_RTOL = 1e-2
DEFAULT_ATOL = 1e-3

def _compare_values():
    """``onnxrt compare``'s per-value comparison (its tolerance rule), imported when
    used: the runtime never loads the command's package."""
    from ..cli.compare import compare_values

    return compare_values


@dataclass
class KeptNode:
    """A node kept in float32, and why."""

    node: str
    op_type: str
    reason: str
    max_abs: float = 0.0
    max_rel: float = 0.0


@dataclass
class MixedPrecisionReport:
    """The result of :func:`auto_mixed_precision`."""

    model: onnx.ModelProto
    kept: list[KeptNode]
    converted: int
    total: int
    iterations: int
    outputs: list[Any] = field(default_factory=list)
    ok: bool = True
    rtol: float = DEFAULT_RTOL
    atol: float = DEFAULT_ATOL


def _run(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], providers) -> dict[str, Any]:
    import onnxrt

    # float16 nodes measured as float16 hardware computes them: the CPU provider's
    # float16_compute transform would run them in float32 and hide every overflow
    sess = onnxrt.InferenceSession(model.SerializeToString(), providers=providers,
                                   disabled_optimizers=["float16_compute"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, dict(feeds))))


def _absmax(v) -> float:
    if isinstance(v, np.ndarray) and v.dtype.kind == "f" and v.size:
        return float(np.abs(v[np.isfinite(v)]).max(initial=0.0))
    return 0.0


def _why(node: onnx.NodeProto, d, ref: Mapping, got: Mapping, rtol: float, atol: float) -> str:
    """Why a float16 node's output differs: a value beyond float16's range, or rounding."""
    wide = [(t, _absmax(ref.get(t))) for t in node.input if _absmax(ref.get(t)) > FLOAT16_MAX]
    if wide:
        return f"it reads {wide[0][0]!r}, beyond float16's range (max |x| = {wide[0][1]:.4g} > 65504)"
    ref_max = _absmax(ref.get(d.name))
    if ref_max > FLOAT16_MAX:
        return f"its output exceeds float16's range (max |x| = {ref_max:.4g} > 65504)"
    if not np.all(np.isfinite(np.asarray(_as32(got[d.name]), dtype=np.float64))):
        return "its float16 output holds inf or NaN"
    return f"float16 error beyond tolerance (rtol {rtol:g}, atol {atol:g})"


def _as32(v):
    return v.astype(np.float32) if isinstance(v, np.ndarray) and v.dtype == np.float16 else v


def auto_mixed_precision(
    model,
    feeds: Mapping[str, np.ndarray],
    rtol: float = DEFAULT_RTOL,
    atol: float = DEFAULT_ATOL,
    keep_io_types: bool = True,
    validate_fn: Callable[[list, list], bool] | None = None,
    op_block_list: Sequence[str] | None = None,
    node_block_list: Sequence[str] | None = None,
    providers: Sequence | None = None,
    max_kept: int | None = None,
) -> MixedPrecisionReport:
    """Convert ``model`` to float16, keeping in float32 the nodes whose float16 error
    exceeds the tolerance on ``feeds`` (see the module doc).

    :param feeds: float32 inputs (cast to float16 for the float16 model's float16 inputs).
    :param rtol: / :param atol: the per-value tolerance, as ``onnxrt compare``'s.
    :param keep_io_types: keep float32 graph inputs and outputs (default). Without it
        the reference runs on the inputs rounded to float16, as the converted model
        receives them, and the outputs are float16 values: a tolerance below float16's
        resolution (about 1e-3 relative) cannot be met.
    :param validate_fn: ``f(reference_outputs, float16_outputs) -> bool``, a further
        test of the model outputs.
    :param op_block_list: / :param node_block_list: kept in float32 from the start.
    :param providers: the onnxrt providers both models run on.
    :param max_kept: stop after keeping this many nodes (default: no limit).
    :returns: a :class:`MixedPrecisionReport`; ``ok`` says whether the outputs agree.
    """
    if rtol < 0 or atol < 0:
        raise InvalidArgument(f"rtol and atol must not be negative, got {rtol}, {atol}")
    compare_values = _compare_values()
    base = load_input_model(model)
    name_nodes(base.graph)
    out_names = [o.name for o in base.graph.output]
    exposed_ref = expose_all_outputs(base)
    if not keep_io_types:
        # the float16 model receives its inputs rounded: the reference does too, so that
        # only the error of the converted nodes is measured
        feeds = {k: (v.astype(np.float16).astype(np.float32) if isinstance(v, np.ndarray) and v.dtype == np.float32
                     else v) for k, v in feeds.items()}
    ref = _run(exposed_ref, feeds, providers)
    ops = list(DEFAULT_OP_BLOCK_LIST if op_block_list is None else op_block_list)
    blocked: list[str] = list(node_block_list or ())
    kept: list[KeptNode] = []
    by_name = {n.name: n for n in base.graph.node}
    order = [n.name for n in base.graph.node]
    iterations = 0
    limit = len(order) if max_kept is None else max_kept
    while True:
        iterations += 1
        m16 = convert_float_to_float16(base, keep_io_types=keep_io_types, op_block_list=ops, node_block_list=blocked)
        half_inputs = {v.name for v in m16.graph.input if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT16}
        f16 = {k: (v.astype(np.float16) if k in half_inputs else v) for k, v in feeds.items()}
        got = _run(expose_all_outputs(m16), f16, providers)
        diffs = [compare_values(o, _as32(got[o]), ref[o], rtol, atol) for o in out_names]
        outputs_ok = all(d.ok for d in diffs)
        if outputs_ok and validate_fn is not None:
            outputs_ok = bool(validate_fn([ref[o] for o in out_names], [got[o] for o in out_names]))
        if outputs_ok or len(kept) >= limit:
            break
        plan = float16_plan(base, ops, blocked)
        culprit = None
        for name in order:
            node = by_name[name]
            ds = [compare_values(o, _as32(got[o]), ref[o], rtol, atol) for o in node.output
                  if o in got and o in ref and isinstance(ref[o], np.ndarray) and ref[o].dtype.kind == "f"]
            bad = [d for d in ds if not d.ok]
            if bad:
                culprit = (node, max(bad, key=lambda d: d.max_abs))
                break
        new: list[KeptNode] = []
        if culprit is not None:
            node, d = culprit
            if plan.get(node.name, False):
                new.append(KeptNode(node.name, node.op_type, _why(node, d, ref, got, rtol, atol), d.max_abs, d.max_rel))
            else:
                # already float32: the error is its float16 inputs', which it amplifies
                for t in node.input:
                    prod = next((p for p in base.graph.node if t in p.output), None)
                    if prod is not None and plan.get(prod.name, False):
                        pd = compare_values(t, _as32(got[t]), ref[t], rtol, atol) if t in got else d
                        new.append(KeptNode(prod.name, prod.op_type,
                                            f"{node.name} ({node.op_type}, float32) amplifies its float16 "
                                            f"output's error beyond tolerance", pd.max_abs, pd.max_rel))
        new = [k for k in new if k.node not in blocked]
        if not new:
            worst, score = None, -1.0
            for name in order:
                if not plan.get(name, False):
                    continue
                for o in by_name[name].output:
                    if o in got and o in ref and isinstance(ref[o], np.ndarray) and ref[o].dtype.kind == "f":
                        d = compare_values(o, _as32(got[o]), ref[o], rtol, atol)
                        scale = max(1.0, float(np.abs(ref[o]).max(initial=0.0)))
                        s = d.max_abs / (atol * scale + 1e-30)
                        if s > score:
                            worst, score = (by_name[name], d), s
            if worst is not None:
                node, d = worst
                new.append(KeptNode(node.name, node.op_type, "the outputs drift through accumulated error, or "
                                    "fail validate_fn; this node's error is the largest against its tolerance",
                                    d.max_abs, d.max_rel))
        new = [k for k in new if k.node not in blocked][:limit - len(kept)]
        if not new:
            break
        for k in new:
            blocked.append(k.node)
            kept.append(k)
    plan = float16_plan(base, ops, blocked)
    converted = sum(1 for v in plan.values() if v)
    return MixedPrecisionReport(m16, kept, converted, len(order), iterations, diffs, outputs_ok, rtol, atol)


def auto_convert_mixed_precision(model, feed_dict, validate_fn=None, rtol=None, atol=None,
                                 keep_io_types: bool = False) -> onnx.ModelProto:
    """onnxconverter-common's signature: the mixed-precision model only (see
    :func:`auto_mixed_precision` for the report)."""
    report = auto_mixed_precision(model, feed_dict, rtol=DEFAULT_RTOL if rtol is None else rtol,
                                  atol=DEFAULT_ATOL if atol is None else atol, keep_io_types=keep_io_types,
                                  validate_fn=validate_fn)
    return report.model
