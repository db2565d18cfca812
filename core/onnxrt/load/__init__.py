"""Stage 1, load: a model from a path, bytes or a ``ModelProto``, with its external data.

:mod:`.model` checks and reads the model and resolves external data safely;
:mod:`.large_weights` reads the large initializers of a big model file straight from
the file, without a second copy in a ``ModelProto``.
"""

from .model import MAX_IR_VERSION, MAX_OPSETS, check_versions, load_model

__all__ = ["load_model", "check_versions", "MAX_IR_VERSION", "MAX_OPSETS"]
