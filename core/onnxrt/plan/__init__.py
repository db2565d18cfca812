"""The execution plan (see :mod:`onnxrt.plan.builder`)."""

from .builder import *  # noqa: F401,F403
from .builder import (Plan, PlanBuilder, RunContext, Step, _copy_fn, array_root, caller_owned,  # noqa: F401
                      reads_shape_only, shape_stand_in, shape_step)
