"""Session options stored in the model, as onnxruntime reads them.

A model may carry an ``ort_config`` metadata entry holding JSON such as
``{"session_options": {"intra_op_num_threads": 2, "graph_optimization_level": 99}}``.
onnxruntime applies it when the session is built with ``read_config_from_model=1`` or
when the environment variable ``ORT_LOAD_CONFIG_FROM_MODEL`` is ``1``; onnxrt does the
same, on a copy of the caller's options. Only the options named in
:data:`MODEL_SETTABLE` may come from a model: a model cannot choose file paths
(``optimized_model_filepath``, ``profile_file_prefix``) for the process that loads it.
"""

from __future__ import annotations

import copy
import json
import os
from typing import Any

from onnx import ModelProto

from .errors import InvalidArgument, InvalidGraph

__all__ = ["ENV_VAR", "METADATA_KEY", "MODEL_SETTABLE", "wants_model_config", "apply_model_config"]

ENV_VAR = "ORT_LOAD_CONFIG_FROM_MODEL"
METADATA_KEY = "ort_config"

#: the session options a model's ``ort_config`` may set, and how each value is read
MODEL_SETTABLE: dict[str, Any] = {
    "intra_op_num_threads": int,
    "inter_op_num_threads": int,
    "graph_optimization_level": int,
    "execution_mode": int,
    "enable_profiling": bool,
    "enable_mem_pattern": bool,
    "enable_mem_reuse": bool,
    "enable_cpu_mem_arena": bool,
    "use_deterministic_compute": bool,
    "log_severity_level": int,
    "log_verbosity_level": int,
}


def wants_model_config(read_config_from_model: Any) -> bool:
    """Whether to apply the model's options: the keyword if given, else the environment."""
    if read_config_from_model is not None:
        try:
            return int(read_config_from_model) == 1
        except (TypeError, ValueError):
            raise InvalidArgument(f"read_config_from_model must be 0 or 1, not {read_config_from_model!r}") from None
    return os.environ.get(ENV_VAR, "0").strip() == "1"


def apply_model_config(proto: ModelProto, so):
    """``so`` with the model's ``ort_config`` session options applied (a copy; ``so`` itself
    when the model has none)."""
    text = next((p.value for p in proto.metadata_props if p.key == METADATA_KEY), None)
    if text is None:
        return so
    try:
        config = json.loads(text)
    except json.JSONDecodeError as e:
        raise InvalidGraph(f"the model's {METADATA_KEY!r} metadata is not valid JSON: {e}") from None
    opts = config.get("session_options", {}) if isinstance(config, dict) else None
    if not isinstance(opts, dict):
        raise InvalidGraph(f"the model's {METADATA_KEY!r} metadata must hold an object with 'session_options'")
    out = copy.copy(so)
    out._config = dict(so._config)
    for key, value in opts.items():
        conv = MODEL_SETTABLE.get(key)
        if conv is None:
            raise InvalidGraph(f"the model's {METADATA_KEY!r} sets session option {key!r}, which a model may not "
                               f"set; it may set: {', '.join(MODEL_SETTABLE)}")
        try:
            if key == "execution_mode":
                from .options import ExecutionMode

                value = ExecutionMode(int(value))
            else:
                value = conv(value)
        except (TypeError, ValueError):
            raise InvalidGraph(f"the model's {METADATA_KEY!r}: {key} = {value!r} is not valid") from None
        setattr(out, key, value)
    return out
