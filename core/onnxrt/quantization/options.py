"""The ``extra_options`` keys: which this package applies, and which onnxruntime keys
it accepts without effect (so that existing scripts run) or refuses."""

from __future__ import annotations

import warnings
from typing import Any, Mapping

from ..errors import InvalidArgument
from .calibrate import CALIBRATION_OPTIONS

__all__ = ["check_extra_options"]

#: Keys applied by the quantizers, besides the ``Calib*`` ones.
APPLIED = {
    "ActivationSymmetric", "WeightSymmetric", "MatMulConstBOnly", "QDQKeepRemovableActivations",
}

#: onnxruntime keys that change nothing here: what they tune does not arise in the
#: models this package writes (or is how it always behaves).
NO_EFFECT = {
    "EnableSubgraph", "ForceQuantizeNoInputCheck", "AddQDQPairToWeight", "DedicatedQDQPair",
    "OpTypesToExcludeOutputQuantization", "QDQOpTypePerChannelSupportToAxis", "UseQDQVectorScale",
    "MinimumRealRange", "SmoothQuant", "SmoothQuantAlpha", "SmoothQuantFolding", "TensorQuantOverrides",
    "QDQDisableWeightAdjustForInt32Bias", "UseQDQContribOps", "CalibMaxIntermediateOutputs",
    "CalibStridedMinMax", "DefaultTensorType",
}

#: Keys whose value changes results here and are not implemented: refused, not ignored.
REFUSED = {"SmoothQuant", "TensorQuantOverrides"}


def check_extra_options(extra_options: Mapping[str, Any] | None) -> dict[str, Any]:
    """``extra_options`` checked: unknown keys and unimplemented ones that would change
    the result are :class:`~onnxrt.errors.InvalidArgument`; the others are kept."""
    if extra_options is None:
        return {}
    if not isinstance(extra_options, Mapping):
        raise InvalidArgument(f"extra_options must be a dict, not {type(extra_options).__name__}")
    opts = dict(extra_options)
    for key, value in opts.items():
        if key in REFUSED and value:
            raise InvalidArgument(f"extra_options[{key!r}] is not supported by onnxrt.quantization")
        if key in APPLIED or key in CALIBRATION_OPTIONS:
            continue
        if key in NO_EFFECT:
            warnings.warn(f"extra_options[{key!r}] has no effect in onnxrt.quantization", stacklevel=3)
            continue
        raise InvalidArgument(f"unknown extra_options key {key!r}; known keys: "
                              f"{', '.join(sorted(APPLIED | set(CALIBRATION_OPTIONS)))}")
    return opts
