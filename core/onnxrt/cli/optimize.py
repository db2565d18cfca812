"""``onnxrt optimize MODEL -o OUT.onnx``: write the model as the session optimizes it.

The level and the providers matter: fusions are applied only where the provider that
owns the nodes has a kernel for the fused op. The written model is checked with
``onnx.checker`` before the command reports success.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import onnx

from ..errors import InvalidGraph
from .common import UsageError, add_model_args, console, make_session, model_path, styled

__all__ = ["add_command", "cmd_optimize"]


def add_command(sub) -> None:
    """Add the ``optimize`` verb."""
    p = sub.add_parser("optimize", help="write the optimized model")
    add_model_args(p, inputs=False)
    p.add_argument("--dim", action="append", metavar="NAME=VALUE",
                   help="fix a symbolic dimension (shape computations on it fold away)")
    p.add_argument("-o", "--output", required=True, metavar="OUT.onnx", help="where to write the optimized model")
    p.set_defaults(func=cmd_optimize)


def cmd_optimize(args) -> int:
    """Run the ``optimize`` verb."""
    from rich.table import Table

    src = model_path(args)
    out = Path(args.output)
    if out.resolve() == src.resolve():
        raise UsageError("-o must differ from the input model")
    if not out.parent.exists():
        raise UsageError(f"-o {out}: folder {str(out.parent)!r} does not exist")
    sess = make_session(args, optimized_model_filepath=str(out))
    try:
        onnx.checker.check_model(str(out))
    except onnx.checker.ValidationError as e:
        raise InvalidGraph(f"the optimized model at {out} does not pass onnx.checker: {e}") from e
    before = Counter(n.op_type for n in onnx.load(str(src), load_external_data=False).graph.node)
    after = Counter(n.op_type for n in onnx.load(str(out), load_external_data=False).graph.node)
    con = console()
    con.print(styled((str(out), "bold"), f": {sum(before.values())} nodes -> {sum(after.values())} "
                     f"(level {args.level}, providers {', '.join(sess.get_providers())}); passes onnx.checker"))
    changed = sorted((op for op in before.keys() | after.keys() if before[op] != after[op]),
                     key=lambda op: after[op] - before[op])
    if changed:
        table = Table(title="op types whose count changed")
        for col, just in (("op type", "left"), ("before", "right"), ("after", "right"), ("change", "right")):
            table.add_column(col, justify=just)
        for op in changed:
            table.add_row(op, str(before[op]), str(after[op]), f"{after[op] - before[op]:+d}")
        con.print(table)
    return 0
