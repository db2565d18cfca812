"""``onnxrt providers``: the installed execution providers, and why any is unavailable.

A table where it fits the terminal without cutting a word; on a narrow terminal (80
columns cannot hold eight columns of provider names, reasons and library paths) each
provider is a block of ``field  value`` lines instead, its values wrapping in full.
"""

from __future__ import annotations

from .common import console

__all__ = ["add_command", "cmd_providers", "FIELDS"]

#: the columns of the table, which are the lines of each block in the narrow layout
FIELDS = ("provider", "aliases", "priority", "available", "reason", "distribution", "version", "details")

_UNBOUNDED = 100_000


def add_command(sub) -> None:
    """Add the ``providers`` verb."""
    pr = sub.add_parser("providers", help="list installed providers, and why any is unavailable")
    pr.set_defaults(func=cmd_providers)


def _rows() -> list[tuple[str, ...]]:
    import onnxrt as ort

    return [(p["name"], ", ".join(p["aliases"]), str(p["priority"]), "yes" if p["available"] else "no",
             p["reason"], p["distribution"], p["version"], p.get("details", "")) for p in ort.get_provider_info()]


def cmd_providers(args) -> int:
    """``onnxrt providers``."""
    from rich.measure import Measurement
    from rich.table import Table

    con = console()
    rows = _rows()
    title = "onnxrt execution providers"
    table = Table(title=title)
    for col in FIELDS:
        table.add_column(col)
    for row in rows:
        table.add_row(*row)
    # the narrowest the table can be with every word whole (measured before folding,
    # which would let a column shrink to one letter); narrower than that, each
    # provider gets its own block
    # (rich clamps a measurement to the width it is given: measure as if unbounded)
    if Measurement.get(con, con.options.update_width(_UNBOUNDED), table).minimum <= con.width:
        for column in table.columns:
            column.overflow = "fold"  # a value longer than its column wraps, never cut short
        con.print(table)
        return 0
    con.print(title, style="italic")
    indent = max(len(f) for f in FIELDS) + 2
    for row in rows:
        con.print()
        con.print(row[0], style="bold")
        for field, value in zip(FIELDS[1:], row[1:]):
            if value:
                _print_field(con, field, value, indent)
    return 0


def _print_field(con, field: str, value: str, indent: int) -> None:
    """``field  value``, the value wrapped at words (folded where a word is longer
    than the line) under its first line; no line carries trailing spaces."""
    from rich.text import Text

    lines = Text(value).wrap(con, max(20, con.width - indent), overflow="fold")
    for i, line in enumerate(lines):
        line.rstrip()
        con.print(Text((field if i == 0 else "").ljust(indent)) + line, soft_wrap=True)
