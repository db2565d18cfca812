"""``onnxrt explain MODEL``: how the session splits the graph among providers.

Prints the node count per provider (with the op types each one runs), every fallback
(a node that a preferred provider did not take) grouped by op type and reason, and
with ``--verbose`` the nodes of each provider and the fused groups.
"""

from __future__ import annotations

from collections import Counter, defaultdict

import onnx

from .common import add_model_args, console, make_session, model_path, styled

__all__ = ["add_command", "cmd_explain", "summarize"]


def add_command(sub) -> None:
    """Add the ``explain`` verb."""
    p = sub.add_parser("explain", help="show how the graph is split among providers, and why")
    add_model_args(p, inputs=False)
    p.add_argument("--dim", action="append", metavar="NAME=VALUE",
                   help="fix a symbolic dimension (INPUT:AXIS=VALUE for an unnamed one)")
    p.add_argument("-v", "--verbose", action="store_true", help="list the nodes of each provider and the fused groups")
    p.set_defaults(func=cmd_explain)


def summarize(assignment: list[dict]) -> dict:
    """Counts per provider, op types per provider, and fallbacks grouped by
    ``(op_type, provider, reason)`` with their node names."""
    per_provider = Counter(d["provider"] for d in assignment)
    ops: dict[str, Counter] = defaultdict(Counter)
    fallbacks: dict[tuple, list[str]] = defaultdict(list)
    for d in assignment:
        ops[d["provider"]][d["op_type"]] += 1
        if d["reason"]:
            fallbacks[(d["op_type"], d["provider"], d["reason"])].append(d["node"])
    return {"per_provider": per_provider, "ops": ops, "fallbacks": fallbacks}


def cmd_explain(args) -> int:
    """Run the ``explain`` verb."""
    from rich.table import Table

    sess = make_session(args)
    model_nodes = len(onnx.load(str(model_path(args)), load_external_data=False).graph.node)
    assignment = sess.get_provider_assignment()
    fused = sess.get_fused_groups()
    s = summarize(assignment)
    con = console()
    con.print(styled((model_path(args).name, "bold"), f": {model_nodes} nodes in the model, "
                     f"{len(assignment)} after optimization (level {args.level}); "
                     f"providers in priority order: {', '.join(sess.get_providers())}"))
    table = Table(title="nodes per provider")
    for col, just in (("provider", "left"), ("nodes", "right"), ("share", "right"), ("op types", "left")):
        table.add_column(col, justify=just)
    total = max(1, len(assignment))
    for prov, n in s["per_provider"].most_common():
        table.add_row(prov, str(n), f"{100 * n / total:.0f}%",
                      ", ".join(f"{op} {c}" for op, c in s["ops"][prov].most_common()))
    table.add_row("total", str(len(assignment)), "100%", "", style="bold")
    con.print(table)
    if s["fallbacks"]:
        fb = Table(title="fallbacks: nodes a preferred provider did not take")
        for col in ("op type", "nodes", "runs on", "why not the preferred providers", "first node"):
            fb.add_column(col, overflow="fold")
        for (op, prov, reason), names in sorted(s["fallbacks"].items(), key=lambda kv: -len(kv[1])):
            fb.add_row(op, str(len(names)), prov, reason, names[0])
        con.print(fb)
    else:
        con.print("no fallbacks: every node runs on the first provider that could take it")
    if fused:
        con.print(f"{len(fused)} fused group(s), {sum(len(g['nodes']) for g in fused)} nodes in them")
    if args.verbose:
        for prov in s["per_provider"]:
            t = Table(title=f"{prov}: nodes")
            for col in ("#", "node", "op type", "reason"):
                t.add_column(col, overflow="fold")
            for i, d in enumerate(assignment):
                if d["provider"] == prov:
                    t.add_row(str(i), d["node"], d["op_type"], d["reason"])
            con.print(t)
        if fused:
            t = Table(title="fused groups")
            for col in ("provider", "nodes"):
                t.add_column(col, overflow="fold")
            for g in fused:
                t.add_row(g["provider"], ", ".join(g["nodes"]))
            con.print(t)
    return 0
