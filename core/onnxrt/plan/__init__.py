"""Execution plans: what a session runs.

- :mod:`.builder`: :class:`PlanBuilder` gives every value an integer slot, inserts a
  copy step wherever a value crosses between devices and computes each value's last
  use; the output helpers (:func:`caller_owned`) live there too.
- :mod:`.codegen`: :class:`Plan` runs its steps as generated straight-line Python,
  one line per step (``plan.code`` shows the source of a run), with errors naming the
  node, op and provider.
- :mod:`.shape_memo`: shape computations (``Shape -> Gather -> Concat``...) run once
  per input shape, compiled by the same generator.
"""

from .builder import (SHAPE_READERS, PlanBuilder, Step, _copy_fn, array_root, caller_owned, reads_shape_only,
                      shape_stand_in, shape_step)
from .codegen import Plan, RunContext, compile_steps, wrap_error

__all__ = ["Step", "Plan", "PlanBuilder", "RunContext", "compile_steps", "wrap_error", "SHAPE_READERS",
           "reads_shape_only", "shape_stand_in", "shape_step", "array_root", "caller_owned"]
