"""``onnxrt compare MODEL --providers A --against B|onnxruntime``: error per output, and
on a mismatch the first node whose outputs differ (see :mod:`onnxrt.tools.compare`).

Exit status: 0 when every output agrees within tolerance, 1 when one does not.
``--always-bisect`` also looks for a differing node when the outputs agree: an error
that later nodes mask (a saturating activation, a max) still shows.
"""

from __future__ import annotations

from ..tools.compare import DEFAULT_ATOL, DEFAULT_RTOL, compare_models
from .common import add_model_args, console, make_feeds, make_session, model_path, providers_arg, session_options

__all__ = ["add_command", "cmd_compare"]


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
    """Run the ``compare`` verb."""
    from rich.table import Table

    sess = make_session(args)  # checks the model and the providers, and gives the inputs
    feeds = make_feeds(args, sess)
    against = args.against if args.against.strip().lower() == "onnxruntime" else providers_arg(args.against)
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
