"""``onnxrt providers``: the installed execution providers, and why any is unavailable."""

from __future__ import annotations

from .common import console

__all__ = ["add_command", "cmd_providers"]


def add_command(sub) -> None:
    """Add the ``providers`` verb."""
    pr = sub.add_parser("providers", help="list installed providers, and why any is unavailable")
    pr.set_defaults(func=cmd_providers)


def cmd_providers(args) -> int:
    """``onnxrt providers``."""
    import onnxrt as ort
    from rich.table import Table

    table = Table(title="onnxrt execution providers")
    for col in ("provider", "aliases", "priority", "available", "reason", "distribution", "version", "details"):
        table.add_column(col)
    for p in ort.get_provider_info():
        table.add_row(p["name"], ", ".join(p["aliases"]), str(p["priority"]),
                      "yes" if p["available"] else "no", p["reason"], p["distribution"], p["version"],
                      p.get("details", ""))
    console().print(table)
    return 0
