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
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import onnx

from ..errors import Fail, InvalidArgument
from .common import add_model_args, console, make_feeds, make_session, model_path, providers_arg, session_options

__all__ = ["ONNXRUNTIME", "ValueDiff", "NodeDivergence", "CompareReport", "compare_models", "compare_values",
           "add_command", "cmd_compare"]

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
class NodeDivergence:
    """The first node whose outputs differ."""

    node: str
    op_type: str
    provider: str
    against_provider: str
    index: int
    outputs: list[ValueDiff]
    inputs: list[str]


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


def _load(model) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return copy.deepcopy(model)
    if isinstance(model, (bytes, bytearray)):
        return onnx.load_from_string(bytes(model))
    from ..load.model import load_model

    proto, _ = load_model(str(model))
    return proto


def _named(model: onnx.ModelProto) -> onnx.ModelProto:
    """Give every unnamed node a unique name, so both sides can report it."""
    seen = {n.name for n in model.graph.node if n.name}
    for i, n in enumerate(model.graph.node):
        if not n.name:
            name = f"{n.op_type}_{i}"
            while name in seen:
                name += "_"
            n.name = name
            seen.add(name)
    return model


def _exposed(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with every node output of the main graph also a graph output."""
    m = copy.deepcopy(model)
    outputs = {o.name for o in m.graph.output}
    for n in m.graph.node:
        for o in n.output:
            if o and o not in outputs:
                m.graph.output.append(onnx.ValueInfoProto(name=o))
                outputs.add(o)
    return m


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
    proto = _named(_load(model))
    a, b = _Side(providers, sess_options), _Side(against, sess_options)
    if a.is_ort:
        raise InvalidArgument("the side under test must be onnxrt providers; put onnxruntime in 'against'")
    out_names = [o.name for o in proto.graph.output]
    ra, rb = a.run(proto, feeds), b.run(proto, feeds)
    report = CompareReport(a.label, b.label, [compare_values(n, ra[n], rb[n], rtol, atol) for n in out_names],
                           rtol, atol)
    if not always_bisect and (report.ok or not bisect):
        return report
    exposed = _exposed(proto)
    va, vb = a.run(exposed, feeds), b.run(exposed, feeds)
    report.bisected = True
    for i, node in enumerate(proto.graph.node):
        report.nodes_checked = i + 1
        diffs = [compare_values(o, va[o], vb[o], rtol, atol) for o in node.output if o and o in va and o in vb]
        if diffs and not all(d.ok for d in diffs):
            report.first_divergence = NodeDivergence(
                node.name, node.op_type, a.assignment.get(node.name, "(optimized away)"),
                b.assignment.get(node.name, "(optimized away)"), i, diffs, list(node.input))
            break
    return report


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
    con.print(f"[bold]{model_path(args).name}[/bold]: {report.side} against {report.against} "
              f"(rtol {args.rtol:g}, atol {args.atol:g})")
    table = Table()
    for col, just in (("output", "left"), ("max abs err", "right"), ("max rel err", "right"), ("", "left")):
        table.add_column(col, justify=just)
    for d in report.outputs:
        status = "[green]ok[/green]" if d.ok else "[red]MISMATCH[/red]"
        table.add_row(d.name, _fmt(d.max_abs), _fmt(d.max_rel), status + (f" ({d.note})" if d.note else ""))
    con.print(table)
    if report.ok:
        con.print("all outputs agree")
    fd = report.first_divergence
    if fd is not None:
        worst = max(fd.outputs, key=lambda d: d.max_abs)
        con.print(f"[bold red]first differing node[/bold red]: {fd.node} ({fd.op_type}), node {fd.index} "
                  f"in topological order")
        con.print(f"  runs on {fd.provider} here and on {fd.against_provider} in the reference; "
                  f"its inputs ({', '.join(i for i in fd.inputs if i) or 'none'}) agree")
        con.print(f"  output {worst.name}: max abs err {_fmt(worst.max_abs)}, max rel err {_fmt(worst.max_rel)}"
                  + (f" ({worst.note})" if worst.note else ""))
    elif report.bisected and not report.ok:
        con.print(f"no single node differs beyond tolerance ({report.nodes_checked} checked); the outputs drift "
                  "through accumulated error, or differ only where nodes are fused")
    elif report.bisected:
        con.print(f"every node agrees ({report.nodes_checked} checked)")
    return 0 if report.ok else 1
