"""Compare a model's results under two engines, and find the first node that differs.

One side is an onnxrt provider list; the other is another provider list or
onnxruntime itself. Both run the same model with every intermediate value exposed as
a graph output, so one run per side yields every value. Walking the nodes in
topological order, the first node whose outputs differ is the one that introduced
the difference: its inputs come from earlier nodes, all of which agree.

Tolerance: an element agrees when ``|a - b| <= atol * scale + rtol * |b|``, with
``scale = max(1, max |b|)`` over the reference tensor. The absolute term follows the
tensor's magnitude because float32 accumulation-order noise does: intermediates in
the hundreds legitimately differ by more than 1e-4 near zero.

From Python: :func:`compare_models`. From the command line: ``onnxrt compare MODEL
--providers A --against B|onnxruntime`` prints the error per output and, on a mismatch,
the first node whose outputs differ; it exits 0 when every output agrees within
tolerance and 1 when one does not. ``--always-bisect`` also looks for a differing node
when the outputs agree: an error that later nodes mask (a saturating activation, a max)
still shows.

Rounding flips: on a quantized model one value that lands on the other side of a
rounding boundary (a QuantizeLinear's .5, an integer product's saturation) moves a code
by one, and the step grows layer by layer. So the report says how far apart the first
differing node's inputs are, bitwise (:class:`InputDistance`: elements that differ and
the largest distance in ulps, units in the last place), and reruns that node alone on
the side under test with the reference's exact inputs: when it then matches, its
kernel is not at fault and the difference is a flip in bits that agree within
tolerance.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import onnx

from ..errors import Fail, InvalidArgument
from ..ir.proto_edits import expose_all_outputs, name_nodes
from .common import (add_model_args, console, make_feeds, make_session, model_path, providers_arg, session_options,
                     styled)

__all__ = ["ONNXRUNTIME", "ValueDiff", "InputDistance", "NodeDivergence", "CompareReport", "compare_models",
           "compare_values", "input_distance", "ulp_distance", "add_command", "cmd_compare"]

#: The ``against`` value that selects onnxruntime's CPU provider as the reference.
ONNXRUNTIME = "onnxruntime"

DEFAULT_RTOL = 1e-3
DEFAULT_ATOL = 1e-4


@dataclass
class ValueDiff:
    """How one value differs between the two sides."""

    name: str
    max_abs: float
    max_rel: float
    ok: bool
    note: str = ""


@dataclass
class InputDistance:
    """How far apart one input of the first differing node is on the two sides, bitwise.

    ``max_ulps`` counts units in the last place of the input's floating-point type
    (adjacent floats are 1 apart, ``+0.0`` and ``-0.0`` are 0 apart), or integer steps
    for an integer input; ``None`` where it does not apply (NaN against a number,
    strings, sequences). Near zero floats are dense, so a tiny absolute difference
    there is many ulps: ``ulps_at_scale`` also gives ``max_abs`` in ulps of the
    tensor's largest magnitude, the size of a flip that matters downstream."""

    name: str
    dtype: str
    size: int
    differing: int
    max_ulps: int | None
    max_abs: float
    ulps_at_scale: float | None = None

    @property
    def bitwise(self) -> bool:
        """True when both sides hold exactly the same bits (NaNs aside)."""
        return self.differing == 0

    def describe(self) -> str:
        """One line: ``x: bitwise equal`` or ``x: 3 of 4096 elements differ, at most 2 ulps ...``."""
        if self.bitwise:
            return f"{self.name}: bitwise equal"
        unit = "integer steps" if self.dtype.startswith(("int", "uint")) else f"ulps of {self.dtype}"
        far = f"at most {self.max_ulps} {unit}" if self.max_ulps is not None else "not comparable in ulps"
        if self.ulps_at_scale is not None and self.max_ulps is not None and self.ulps_at_scale < self.max_ulps:
            far += f" ({self.ulps_at_scale:.3g} ulps of its largest magnitude)"
        return (f"{self.name}: {self.differing} of {self.size} elements differ, {far}, "
                f"max abs {self.max_abs:.3g}")


@dataclass
class NodeDivergence:
    """The first node whose outputs differ."""

    node: str
    op_type: str
    provider: str
    against_provider: str
    index: int
    outputs: list[ValueDiff]
    inputs: list[str]
    #: how far apart each computed input (not the initializers) is on the two sides
    input_distances: list[InputDistance] = field(default_factory=list)
    #: the node run alone on the side under test with the reference's exact inputs:
    #: True when it then matches the reference, False when it still differs, None when
    #: its inputs were bitwise equal already or it cannot run alone
    matches_on_reference_inputs: bool | None = None
    #: why the node could not be rerun alone, when it could not
    rerun_note: str = ""

    @property
    def inputs_bitwise(self) -> bool:
        """True when every computed input is bitwise equal on both sides."""
        return all(d.bitwise for d in self.input_distances)


@dataclass
class CompareReport:
    """The result of :func:`compare_models`."""

    side: str
    against: str
    outputs: list[ValueDiff]
    rtol: float
    atol: float
    first_divergence: NodeDivergence | None = None
    nodes_checked: int = 0
    bisected: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when every model output agrees within tolerance."""
        return all(d.ok for d in self.outputs)


def compare_values(name: str, a, b, rtol: float = DEFAULT_RTOL, atol: float = DEFAULT_ATOL) -> ValueDiff:
    """Compare value ``a`` with the reference ``b``."""
    if not isinstance(a, np.ndarray) or not isinstance(b, np.ndarray):
        if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
            diffs = [compare_values(f"{name}[{i}]", x, y, rtol, atol) for i, (x, y) in enumerate(zip(a, b))]
            return ValueDiff(name, max((d.max_abs for d in diffs), default=0.0),
                             max((d.max_rel for d in diffs), default=0.0), all(d.ok for d in diffs),
                             f"sequence of {len(a)}")
        same = type(a) is type(b)
        return ValueDiff(name, 0.0 if same else float("inf"), 0.0 if same else float("inf"), same,
                         f"{type(a).__name__} vs {type(b).__name__}")
    if a.shape != b.shape:
        return ValueDiff(name, float("inf"), float("inf"), False, f"shape {list(a.shape)} vs {list(b.shape)}")
    if a.size == 0:
        return ValueDiff(name, 0.0, 0.0, True)
    if a.dtype.kind not in "fciub" or b.dtype.kind not in "fciub":
        eq = bool(np.array_equal(a, b))
        return ValueDiff(name, 0.0 if eq else float("inf"), 0.0 if eq else float("inf"), eq)
    note = "" if a.dtype == b.dtype else f"dtype {a.dtype} vs {b.dtype}"
    x = a.astype(np.float64)
    y = b.astype(np.float64)
    both_nan = np.isnan(x) & np.isnan(y)
    with np.errstate(invalid="ignore"):  # inf - inf: handled as `exact` below
        diff = np.where(both_nan, 0.0, np.abs(x - y))
    diff = np.where(np.isnan(diff), np.inf, diff)
    mag = np.abs(np.where(np.isfinite(y), y, 0.0))
    scale = max(1.0, float(mag.max()))
    exact = x == y  # equal infinities have a NaN difference but agree
    ok_elem = exact | both_nan | (diff <= atol * scale + rtol * mag)
    rel = np.where(exact | both_nan, 0.0, diff / np.maximum(mag, atol))
    return ValueDiff(name, float(np.max(np.where(exact, 0.0, diff))), float(rel.max()),
                     bool(ok_elem.all()) and not note, note)


_UINT_OF = {2: np.int16, 4: np.int32, 8: np.int64}


def ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise distance in units in the last place between two float arrays of
    one dtype (float16, float32 or float64): the number of representable values
    between them, so adjacent floats are 1 apart and ``+0.0``, ``-0.0`` are 0 apart.
    NaN against NaN is 0; NaN against a number is -1 (no distance)."""
    if a.dtype != b.dtype or a.dtype.kind != "f" or a.dtype.itemsize not in _UINT_OF:
        raise InvalidArgument(f"ulp_distance needs two float16/32/64 arrays of one dtype, got {a.dtype} and {b.dtype}")
    ints = _UINT_OF[a.dtype.itemsize]
    lowest = int(np.iinfo(ints).min)

    def ordered(x: np.ndarray) -> np.ndarray:
        # sign-magnitude bits to a monotonic integer line: negatives mirror below zero
        i = np.ascontiguousarray(x).view(ints).astype(np.int64)
        return np.where(i < 0, lowest - i, i)

    oa, ob = ordered(a), ordered(b)
    d = np.abs(oa - ob)
    if a.dtype.itemsize == 8:
        # across zero the int64 difference can overflow: those are far apart anyway,
        # counted in float64 and capped
        across = (oa < 0) != (ob < 0)
        if across.any():
            far = np.minimum(np.abs(oa.astype(np.float64)) + np.abs(ob.astype(np.float64)), 2.0 ** 62)
            d = np.where(across, far.astype(np.int64), d)
    na, nb = np.isnan(a), np.isnan(b)
    d = np.where(na & nb, 0, d)
    return np.where(na ^ nb, -1, d)


def input_distance(name: str, a, b) -> InputDistance:
    """How far apart value ``a`` (the side under test) is from the reference ``b``, bitwise."""
    if not isinstance(a, np.ndarray) or not isinstance(b, np.ndarray) or a.shape != b.shape:
        same = isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.shape == b.shape
        size = int(getattr(b, "size", 0) or 0)
        return InputDistance(name, str(getattr(b, "dtype", type(b).__name__)), size,
                             0 if same else max(size, 1), None, float("inf"))
    dtype = str(b.dtype)
    if a.dtype != b.dtype or a.dtype.kind not in "fiub":
        differ = int(np.sum(a != b)) if a.dtype == b.dtype else a.size
        return InputDistance(name, dtype, int(b.size), differ, None, float("inf") if differ else 0.0)
    if a.dtype.kind == "f":
        if a.dtype.itemsize not in _UINT_OF:  # longdouble: no integer of its width to count ulps in
            differ = int(np.count_nonzero((a != b) & ~(np.isnan(a) & np.isnan(b))))
            return InputDistance(name, dtype, int(b.size), differ, None,
                                 float(np.nanmax(np.abs(a - b))) if differ else 0.0)
        d = ulp_distance(a, b)
        differing = int(np.count_nonzero(d))
        with np.errstate(invalid="ignore"):
            absd = np.abs(a.astype(np.float64) - b.astype(np.float64))
        absd = np.where(np.isnan(a) & np.isnan(b), 0.0, absd)
        max_abs = float(np.nanmax(absd)) if absd.size else 0.0
        ulps = None if (d < 0).any() else (int(d.max()) if d.size else 0)
        finite = np.abs(b[np.isfinite(b)])
        top = b.dtype.type(finite.max()) if finite.size else b.dtype.type(0)
        at_scale = max_abs / float(np.spacing(top)) if top > 0 and np.isfinite(max_abs) else None
        return InputDistance(name, dtype, int(b.size), differing, ulps, max_abs, at_scale)
    d = np.abs(a.astype(np.int64) - b.astype(np.int64)) if a.dtype.kind != "b" else (a != b).astype(np.int64)
    m = int(d.max()) if d.size else 0
    return InputDistance(name, dtype, int(b.size), int(np.count_nonzero(d)), m, float(m))


def _node_alone(proto: onnx.ModelProto, node: onnx.NodeProto, values: Mapping[str, Any]):
    """A model of ``node`` alone whose inputs are graph inputs fed with ``values``
    (initializers stay initializers); ``None`` with a reason where that cannot be made."""
    from onnx import helper

    inits = {t.name: t for t in proto.graph.initializer}
    graph_inputs, graph_inits, feeds = [], [], {}
    for name in node.input:
        if not name or name in feeds or any(t.name == name for t in graph_inits):
            continue
        if name in inits and name not in values:
            graph_inits.append(inits[name])
            continue
        v = values.get(name)
        if not isinstance(v, np.ndarray) or v.dtype.kind not in "fiub":
            return None, f"input {name!r} is not a numeric tensor"
        try:
            elem = helper.np_dtype_to_tensor_dtype(v.dtype)
        except (KeyError, TypeError, ValueError):
            return None, f"input {name!r} has dtype {v.dtype}"
        graph_inputs.append(helper.make_tensor_value_info(name, elem, list(v.shape)))
        feeds[name] = v
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
        return None, "it holds subgraphs, which may read values from the graph around it"
    outputs = [onnx.ValueInfoProto(name=o) for o in node.output if o]
    g = helper.make_graph([copy.deepcopy(node)], f"{node.name}_alone", graph_inputs, outputs, graph_inits)
    m = helper.make_model(g, opset_imports=list(proto.opset_import))
    m.ir_version = proto.ir_version
    m.functions.extend(proto.functions)
    return (m, feeds), ""


def _load(model) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return copy.deepcopy(model)
    if isinstance(model, (bytes, bytearray)):
        return onnx.load_from_string(bytes(model))
    from ..load.model import load_model

    proto, _ = load_model(str(model))
    return proto


class _Side:
    """One way of running a model: onnxrt with a provider list, or onnxruntime."""

    def __init__(self, spec, sess_options=None):
        self.is_ort = isinstance(spec, str) and spec.lower() == ONNXRUNTIME
        if isinstance(spec, str) and not self.is_ort:
            spec = [s.strip() for s in spec.split(",") if s.strip()]
        self.providers = None if self.is_ort else (list(spec) if spec else None)
        self.sess_options = sess_options
        self.label = "onnxruntime" if self.is_ort else (",".join(map(str, self.providers or [])) or "default")
        self.assignment: dict[str, str] = {}

    def run(self, model: onnx.ModelProto, feeds: Mapping[str, Any]) -> dict[str, Any]:
        data = model.SerializeToString()
        if self.is_ort:
            try:
                import onnxruntime as ort_ref
            except ImportError:
                raise InvalidArgument("comparing against onnxruntime needs the onnxruntime package") from None
            try:
                sess = ort_ref.InferenceSession(data, providers=["CPUExecutionProvider"])
                names = [o.name for o in sess.get_outputs()]
                values = sess.run(None, dict(feeds))
            except Exception as e:  # noqa: BLE001 - onnxruntime's own error types
                raise Fail(f"onnxruntime could not run the model: {type(e).__name__}: {e}") from e
            self.assignment = {n.name: "onnxruntime" for n in model.graph.node}
            return dict(zip(names, values))
        import onnxrt

        sess = onnxrt.InferenceSession(data, self.sess_options, providers=self.providers)
        names = [o.name for o in sess.get_outputs()]
        self.label = ",".join(sess.get_providers())
        self.assignment = {d["node"]: d["provider"] for d in sess.get_provider_assignment()}
        for g in sess.get_fused_groups():
            for n in g["nodes"]:
                self.assignment[n] = f"{g['provider']} (fused)"
        return dict(zip(names, sess.run(None, dict(feeds))))


def compare_models(
    model,
    feeds: Mapping[str, Any],
    providers: Sequence | str | None = None,
    against: Sequence | str = ONNXRUNTIME,
    rtol: float = DEFAULT_RTOL,
    atol: float = DEFAULT_ATOL,
    bisect: bool = True,
    sess_options=None,
    always_bisect: bool = False,
) -> CompareReport:
    """Run ``model`` with onnxrt on ``providers`` and on ``against`` (another provider
    list, or ``"onnxruntime"``), and compare the outputs.

    :param model: a path, serialized bytes or a ``ModelProto``.
    :param feeds: input name -> array, used by both sides.
    :param providers: onnxrt providers (names, aliases, a comma-separated string);
        ``None`` uses the default priority order.
    :param against: the reference: provider names, or ``"onnxruntime"``.
    :param rtol: relative tolerance.
    :param atol: absolute tolerance, scaled by the tensor's magnitude when that exceeds 1.
    :param bisect: when an output differs, find the first node whose outputs differ.
    :param sess_options: :class:`~onnxrt.SessionOptions` for the onnxrt sides.
    :param always_bisect: look for a differing node even when the outputs agree (an
        error that later nodes mask, as a saturating activation does).
    :returns: a :class:`CompareReport`.
    """
    proto = _load(model)
    name_nodes(proto.graph)  # both sides can report every node
    a, b = _Side(providers, sess_options), _Side(against, sess_options)
    if a.is_ort:
        raise InvalidArgument("the side under test must be onnxrt providers; put onnxruntime in 'against'")
    out_names = [o.name for o in proto.graph.output]
    ra, rb = a.run(proto, feeds), b.run(proto, feeds)
    report = CompareReport(a.label, b.label, [compare_values(n, ra[n], rb[n], rtol, atol) for n in out_names],
                           rtol, atol)
    if not always_bisect and (report.ok or not bisect):
        return report
    exposed = expose_all_outputs(proto)
    va, vb = a.run(exposed, feeds), b.run(exposed, feeds)
    report.bisected = True
    for i, node in enumerate(proto.graph.node):
        report.nodes_checked = i + 1
        diffs = [compare_values(o, va[o], vb[o], rtol, atol) for o in node.output if o and o in va and o in vb]
        if diffs and not all(d.ok for d in diffs):
            fd = NodeDivergence(
                node.name, node.op_type, a.assignment.get(node.name, "(optimized away)"),
                b.assignment.get(node.name, "(optimized away)"), i, diffs, list(node.input))
            _explain_inputs(fd, proto, node, feeds, va, vb, a, rtol, atol)
            report.first_divergence = fd
            break
    return report


def _explain_inputs(fd: NodeDivergence, proto: onnx.ModelProto, node: onnx.NodeProto, feeds: Mapping[str, Any],
                    va: Mapping[str, Any], vb: Mapping[str, Any], side: "_Side", rtol: float, atol: float) -> None:
    """Fill in how far apart the node's computed inputs are and, when they are not
    bitwise equal, whether the node alone matches the reference on the reference's inputs."""
    seen = set()
    ref_values: dict[str, Any] = {}
    for name in node.input:
        if not name or name in seen:
            continue
        seen.add(name)
        if name in feeds:
            ref_values[name] = np.asarray(feeds[name]) if not isinstance(feeds[name], list) else feeds[name]
            continue  # both sides were fed the same array
        if name in va and name in vb:
            fd.input_distances.append(input_distance(name, va[name], vb[name]))
            ref_values[name] = vb[name]
    if fd.inputs_bitwise:
        return
    built, why = _node_alone(proto, node, ref_values)
    if built is None:
        fd.rerun_note = why
        return
    alone, alone_feeds = built
    try:
        got = side.run(alone, alone_feeds)
    except Exception as e:  # noqa: BLE001 - any failure only means no verdict
        fd.rerun_note = f"it did not run alone: {type(e).__name__}: {e}"
        return
    fd.matches_on_reference_inputs = all(
        compare_values(o, got[o], vb[o], rtol, atol).ok for o in node.output if o and o in got and o in vb)


# -- the ``onnxrt compare`` verb ---------------------------------------------------------


def add_command(sub) -> None:
    """Add the ``compare`` verb."""
    p = sub.add_parser("compare", help="compare providers (or onnxruntime) and find the first differing node")
    add_model_args(p)
    p.add_argument("--against", default="onnxruntime",
                   help="the reference: comma-separated providers, or 'onnxruntime' (default)")
    p.add_argument("--rtol", type=float, default=DEFAULT_RTOL, help=f"relative tolerance (default {DEFAULT_RTOL:g})")
    p.add_argument("--atol", type=float, default=DEFAULT_ATOL,
                   help=f"absolute tolerance, scaled by the tensor's largest magnitude above 1 "
                        f"(default {DEFAULT_ATOL:g})")
    p.add_argument("--no-bisect", action="store_true", help="only compare the outputs")
    p.add_argument("--always-bisect", action="store_true",
                   help="look for a differing node even when the outputs agree (errors masked downstream)")
    p.set_defaults(func=cmd_compare)


def _fmt(x: float) -> str:
    return "inf" if x == float("inf") else f"{x:.3g}"


def cmd_compare(args) -> int:
    """Run the ``compare`` verb: 0 when every output agrees within tolerance, else 1."""
    from rich.table import Table

    sess = make_session(args)  # checks the model and the providers, and gives the inputs
    feeds = make_feeds(args, sess)
    against = args.against if args.against.strip().lower() == ONNXRUNTIME else providers_arg(args.against)
    report = compare_models(str(model_path(args)), feeds, sess.get_providers(),
                            against, rtol=args.rtol, atol=args.atol, bisect=not args.no_bisect,
                            always_bisect=args.always_bisect,
                            sess_options=session_options(args))
    con = console()
    con.print(styled((model_path(args).name, "bold"), f": {report.side} against {report.against} "
                     f"(rtol {args.rtol:g}, atol {args.atol:g})"))
    table = Table()
    for col, just in (("output", "left"), ("max abs err", "right"), ("max rel err", "right"), ("", "left")):
        table.add_column(col, justify=just)
    for d in report.outputs:
        status = ("ok", "green") if d.ok else ("MISMATCH", "red")
        table.add_row(d.name, _fmt(d.max_abs), _fmt(d.max_rel), styled(status, f" ({d.note})" if d.note else ""))
    con.print(table)
    if report.ok:
        con.print("all outputs agree")
    fd = report.first_divergence
    if fd is not None:
        worst = max(fd.outputs, key=lambda d: d.max_abs)
        con.print(styled(("first differing node", "bold red"), f": {fd.node} ({fd.op_type}), node {fd.index} "
                         f"in topological order"))
        con.print(f"  runs on {fd.provider} here and on {fd.against_provider} in the reference; "
                  f"its inputs ({', '.join(i for i in fd.inputs if i) or 'none'}) agree")
        con.print(f"  output {worst.name}: max abs err {_fmt(worst.max_abs)}, max rel err {_fmt(worst.max_rel)}"
                  + (f" ({worst.note})" if worst.note else ""))
        for dist in fd.input_distances:
            con.print(f"  input {dist.describe()}")
        if fd.input_distances and fd.inputs_bitwise:
            con.print("  its inputs are bitwise equal: the difference starts in this node")
        elif fd.matches_on_reference_inputs is True:
            con.print("  run alone on the reference's inputs it matches the reference: the difference comes from "
                      "its inputs' last bits (a rounding flip upstream), not from its kernel")
        elif fd.matches_on_reference_inputs is False:
            con.print("  run alone on the reference's inputs it still differs: its kernel disagrees")
        elif fd.rerun_note:
            con.print(f"  not rerun alone on the reference's inputs: {fd.rerun_note}")
    elif report.bisected and not report.ok:
        con.print(f"no single node differs beyond tolerance ({report.nodes_checked} checked); the outputs drift "
                  "through accumulated error, or differ only where nodes are fused")
    elif report.bisected:
        con.print(f"every node agrees ({report.nodes_checked} checked)")
    return 0 if report.ok else 1
