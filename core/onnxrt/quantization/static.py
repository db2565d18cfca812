"""``quantize_static``: calibrate on onnxrt, then write a QDQ or QOperator model."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Sequence


from ..errors import InvalidArgument
from .calibrate import collect_ranges
from ..ir.proto_edits import name_nodes
from .graph import GraphIndex, check_graph, ensure_opset, is_valid, load_input_model, op_counts, save_output_model
from .options import check_extra_options
from .plan import calibration_tensors, fold_relus, make_plan, select_nodes
from .report import QuantizationReport
from .types import CalibrationMethod, QuantFormat, QuantType, as_quant_type

__all__ = ["quantize_static"]


def quantize_static(
    model_input,
    model_output,
    calibration_data_reader=None,
    quant_format: QuantFormat = QuantFormat.QDQ,
    op_types_to_quantize: Sequence[str] | None = None,
    per_channel: bool = False,
    reduce_range: bool = False,
    activation_type: QuantType = QuantType.QInt8,
    weight_type: QuantType = QuantType.QInt8,
    nodes_to_quantize: Sequence[str] | None = None,
    nodes_to_exclude: Sequence[str] | None = None,
    use_external_data_format: bool = False,
    calibrate_method: CalibrationMethod = CalibrationMethod.MinMax,
    calibration_providers: Sequence | None = None,
    extra_options: dict[str, Any] | None = None,
    calibration_cache_path=None,
    *,
    calibration_parallel=None,
    show_progress: bool = True,
) -> QuantizationReport:
    """Quantize ``model_input`` with activation ranges calibrated on onnxrt, and save it
    to ``model_output`` (onnxruntime's signature).

    :param model_input: a path, serialized bytes or an ``onnx.ModelProto``.
    :param model_output: the path to write; ``None`` only returns the model in the report.
    :param calibration_data_reader: a :class:`CalibrationDataReader` (or any iterable
        of feeds) giving representative inputs.
    :param quant_format: :class:`QuantFormat` ``QDQ`` (default) or ``QOperator``.
    :param op_types_to_quantize: the op types to quantize (default: all this package
        handles, :data:`~onnxrt.quantization.plan.DEFAULT_STATIC_OPS`).
    :param per_channel: weights with one scale per output channel.
    :param reduce_range: 7-bit weights.
    :param activation_type: :class:`QuantType` of activations (QInt8, QUInt8; QInt16
        and QUInt16 in QDQ).
    :param weight_type: :class:`QuantType` of weights.
    :param nodes_to_quantize: quantize only these nodes (by name).
    :param nodes_to_exclude: leave these nodes in float.
    :param use_external_data_format: write the weights to ``model_output + ".data"``.
    :param calibrate_method: :class:`CalibrationMethod` MinMax, Entropy or Percentile.
    :param calibration_providers: the onnxrt providers calibration runs on.
    :param extra_options: onnxruntime's options: ``ActivationSymmetric``,
        ``WeightSymmetric``, ``Calib*`` (see :mod:`onnxrt.quantization.calibrate`).
    :param calibration_cache_path: a JSON file of calibrated ranges: read instead of
        calibrating when it exists (``calibration_data_reader`` may then be ``None``),
        written after calibrating when it does not.
    :param calibration_parallel: ``None``, ``"dask"``, a ``dask.distributed.Client`` or
        ``"ray"``: run the calibration batches on those workers.
    :param show_progress: a progress bar while calibrating (on a terminal).
    :returns: a :class:`QuantizationReport` (onnxruntime returns ``None``).
    """
    fmt = quant_format if isinstance(quant_format, QuantFormat) else QuantFormat.from_string(quant_format)
    act = as_quant_type(activation_type, "activation_type")
    wt = as_quant_type(weight_type, "weight_type")
    method = (calibrate_method if isinstance(calibrate_method, CalibrationMethod)
              else CalibrationMethod.from_string(calibrate_method))
    if fmt == QuantFormat.QOperator and (act not in (QuantType.QInt8, QuantType.QUInt8)
                                         or wt not in (QuantType.QInt8, QuantType.QUInt8)):
        raise InvalidArgument("the QOperator format is 8-bit only: activation_type and weight_type must be "
                              "QInt8 or QUInt8 (use QuantFormat.QDQ for 16-bit activations)")
    options = check_extra_options(extra_options)
    original = load_input_model(model_input)
    size_before = original.ByteSize()  # the writers edit the model in place
    valid = is_valid(original)
    wide = any(t in (QuantType.QInt16, QuantType.QUInt16) for t in (act, wt))
    model = ensure_opset(original, 21 if wide else 13)
    name_nodes(model.graph)
    before = op_counts(model)
    candidates = select_nodes(model, op_types_to_quantize, nodes_to_quantize, nodes_to_exclude)
    index = GraphIndex(model)
    tensors = calibration_tensors(index, candidates)
    cache = Path(calibration_cache_path) if calibration_cache_path is not None else None
    if cache is not None and cache.exists():
        ranges = _read_cache(cache)
    else:
        if calibration_data_reader is None:
            raise InvalidArgument("quantize_static needs a calibration_data_reader (or an existing "
                                  "calibration_cache_path)")
        ranges = collect_ranges(model, calibration_data_reader, tensors, method, calibration_providers, options,
                                parallel=calibration_parallel, show_progress=show_progress)
        if cache is not None:
            cache.parent.mkdir(parents=True, exist_ok=True)
            cache.write_text(json.dumps({"method": method.name, "ranges": {t: list(r) for t, r in ranges.items()}},
                                        indent=1))
    plan = make_plan(model, candidates, ranges, act, wt, per_channel, reduce_range, options,
                     qoperator=fmt == QuantFormat.QOperator)
    folded = [] if options.get("QDQKeepRemovableActivations") else fold_relus(plan)
    if fmt == QuantFormat.QDQ:
        from .qdq import write_qdq

        out = write_qdq(plan)
    else:
        from .qoperator import write_qoperator

        out = write_qoperator(plan)
    check_graph(out, valid)
    if model_output is not None:
        save_output_model(out, model_output, use_external_data_format)
    return QuantizationReport(
        model=out, format=fmt.name, before=before, after=op_counts(out),
        quantized=sorted(plan.nodes), skipped=dict(plan.skipped), folded=list(folded),
        size_before=size_before, size_after=out.ByteSize(), ranges=ranges,
        output=os.fspath(model_output) if model_output is not None else None)


def _read_cache(path: Path) -> dict[str, tuple[float, float]]:
    """The ranges a previous ``quantize_static`` saved to ``calibration_cache_path``."""
    try:
        data = json.loads(path.read_text())
        return {str(t): (float(r[0]), float(r[1])) for t, r in data["ranges"].items()}
    except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
        raise InvalidArgument(f"calibration_cache_path {str(path)!r} is not a calibration cache: {e}") from None
