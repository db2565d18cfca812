"""Writing the optimized model (``SessionOptions.optimized_model_filepath``).

With the session config entry ``session.optimized_model_external_initializers_file_name``
set, initializers of at least ``session.optimized_model_external_initializers_min_size_in_bytes``
bytes (default 1024) go to that file, beside the model file, as onnxruntime writes them;
the file name must be a plain relative name inside the model's folder.
"""

from __future__ import annotations

import os
from pathlib import Path

import onnx
from onnx import ModelProto

from .errors import InvalidArgument

__all__ = ["EXTERNAL_FILE_KEY", "MIN_SIZE_KEY", "write_optimized"]

EXTERNAL_FILE_KEY = "session.optimized_model_external_initializers_file_name"
MIN_SIZE_KEY = "session.optimized_model_external_initializers_min_size_in_bytes"


def write_optimized(model: ModelProto, path: str, config: dict[str, str]) -> None:
    """Save ``model`` at ``path``, with large initializers in the external file the config names."""
    name = config.get(EXTERNAL_FILE_KEY, "").strip()
    if not name:
        onnx.save(model, path)
        return
    loc = Path(name)
    if loc.is_absolute() or ".." in loc.parts:
        raise InvalidArgument(f"{EXTERNAL_FILE_KEY} must be a file name inside the model's folder, not {name!r}")
    text = config.get(MIN_SIZE_KEY, "1024").strip()
    try:
        threshold = int(text)
    except ValueError:
        threshold = -1
    if threshold < 0:
        raise InvalidArgument(f"{MIN_SIZE_KEY} must be a non-negative integer, not {text!r}")
    target = Path(os.path.abspath(path)).parent / loc
    if target.exists():
        target.unlink()  # onnx appends to an existing data file; a fresh save starts it anew
    onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True, location=name,
                    size_threshold=threshold, convert_attribute=False)
