"""The ``onnxrt quantize`` and ``onnxrt float16`` verbs.

:func:`register` adds both to the ``onnxrt`` command's argument parser; each verb's
``func`` takes the parsed arguments and returns the exit status, after printing a
table of what changed.

``onnxrt quantize MODEL -o OUT --dynamic`` quantizes weights only;
``onnxrt quantize MODEL -o OUT --calibrate DIR`` calibrates on the inputs in ``DIR``:

- one ``NAME.npy`` per model input, whose first axis counts samples (cut into
  batches of ``--batch-size``);
- or ``.npz`` files, each one batch holding every input by name;
- or, for a model with one input, any ``.npy`` files, each one batch.

``onnxrt float16 MODEL -o OUT`` converts to float16; with ``--auto FEEDS`` (a ``.npz``
of the inputs, a folder of ``NAME.npy``, or one ``.npy`` for a one-input model) the
nodes whose float16 error exceeds the tolerance stay float32, each reported with why.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..errors import InvalidArgument, NoSuchFile

__all__ = ["register", "cmd_quantize", "cmd_float16", "read_calibration_dir", "read_feeds"]


def register(subparsers) -> None:
    """Add the ``quantize`` and ``float16`` verbs to an argparse ``subparsers`` object."""
    q = subparsers.add_parser("quantize", help="quantize a model to int8 (dynamic, or calibrated on onnxrt)")
    q.add_argument("model", help="path to a float32 .onnx model")
    q.add_argument("-o", "--output", required=True, help="path of the quantized model to write")
    how = q.add_mutually_exclusive_group(required=True)
    how.add_argument("--dynamic", action="store_true", help="integer weights, activations quantized at run time")
    how.add_argument("--calibrate", metavar="DIR", help="static quantization calibrated on the .npy/.npz inputs in DIR")
    q.add_argument("--format", choices=["qdq", "qoperator"], default="qdq", help="static format (default qdq)")
    q.add_argument("--method", choices=["minmax", "entropy", "percentile"], default="minmax",
                   help="calibration method (default minmax)")
    q.add_argument("--activation-type", choices=["int8", "uint8", "int16", "uint16"], default="int8")
    q.add_argument("--weight-type", choices=["int8", "uint8"], default="int8")
    q.add_argument("--per-channel", action="store_true", help="one weight scale per output channel")
    q.add_argument("--reduce-range", action="store_true", help="7-bit weights")
    q.add_argument("--op-types", help="comma-separated op types to quantize (default: all handled)")
    q.add_argument("--exclude", action="append", metavar="NODE", help="a node to leave in float (repeatable)")
    q.add_argument("--batch-size", type=int, default=16, help="rows per calibration batch for NAME.npy inputs")
    q.add_argument("--providers", help="comma-separated onnxrt providers that run the calibration")
    q.add_argument("--parallel", choices=["dask", "ray"], help="run calibration batches on a Dask or Ray cluster")
    q.set_defaults(func=cmd_quantize)

    f = subparsers.add_parser("float16", help="convert a model to float16 (with --auto: mixed precision)")
    f.add_argument("model", help="path to a float32 .onnx model")
    f.add_argument("-o", "--output", required=True, help="path of the converted model to write")
    f.add_argument("--auto", metavar="FEEDS",
                   help="keep in float32 the nodes whose float16 error on these inputs exceeds the tolerance")
    f.add_argument("--keep-io-types", action="store_true", help="keep float32 graph inputs and outputs")
    f.add_argument("--block-op", action="append", metavar="OP", help="an op type to keep in float32 (repeatable)")
    f.add_argument("--block-node", action="append", metavar="NODE", help="a node to keep in float32 (repeatable)")
    f.add_argument("--rtol", type=float, default=None, help="relative tolerance for --auto (default 1e-2)")
    f.add_argument("--atol", type=float, default=None, help="absolute tolerance for --auto (default 1e-3)")
    f.add_argument("--providers", help="comma-separated onnxrt providers for --auto's runs")
    f.set_defaults(func=cmd_float16)


def _providers(value: str | None):
    return [p.strip() for p in value.split(",") if p.strip()] if value else None


def _model_inputs(path: str) -> list[str]:
    import onnx

    if not os.path.isfile(path):
        raise NoSuchFile(f"model file {path!r} does not exist")
    m = onnx.load(path, load_external_data=False)
    inits = {t.name for t in m.graph.initializer}
    return [v.name for v in m.graph.input if v.name not in inits]


def _load(path: Path):
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise InvalidArgument(f"cannot read {str(path)!r} as a numpy array: {e}") from None


def read_calibration_dir(directory: str, inputs: list[str], batch_size: int = 16) -> list[dict[str, np.ndarray]]:
    """The calibration batches in ``directory`` (the layouts of the module doc)."""
    d = Path(directory)
    if not d.is_dir():
        raise InvalidArgument(f"--calibrate {directory!r} is not a directory")
    if batch_size < 1:
        raise InvalidArgument(f"--batch-size must be positive, not {batch_size}")
    npz = sorted(d.glob("*.npz"))
    npy = sorted(d.glob("*.npy"))
    if npz:
        batches = []
        for f in npz:
            data = _load(f)
            missing = [i for i in inputs if i not in data.files]
            if missing:
                raise InvalidArgument(f"{str(f)!r} lacks the model inputs {missing} (it holds {data.files})")
            batches.append({i: data[i] for i in inputs})
        return batches
    named = {f.stem: f for f in npy}
    if all(i in named for i in inputs):
        from .calibrate import NumpyDataReader

        reader = NumpyDataReader({i: _load(named[i]) for i in inputs}, batch_size)
        return list(reader)
    if len(inputs) == 1 and npy:
        return [{inputs[0]: _load(f)} for f in npy]
    raise InvalidArgument(f"{directory!r} holds no calibration inputs: expected {', '.join(i + '.npy' for i in inputs)}"
                          f", .npz files holding them{', or .npy batches' if len(inputs) == 1 else ''}")


def read_feeds(source: str, inputs: list[str]) -> dict[str, np.ndarray]:
    """The feeds for ``--auto``: a ``.npz``, a folder of ``NAME.npy``, or one ``.npy``."""
    p = Path(source)
    if p.is_dir():
        feeds = {i: _load(p / f"{i}.npy") for i in inputs if (p / f"{i}.npy").exists()}
    elif p.suffix == ".npz" and p.is_file():
        data = _load(p)
        feeds = {i: data[i] for i in inputs if i in data.files}
    elif p.suffix == ".npy" and p.is_file() and len(inputs) == 1:
        feeds = {inputs[0]: _load(p)}
    else:
        raise InvalidArgument(f"--auto {source!r}: expected a .npz file, a folder of NAME.npy files, or one .npy "
                              "for a model with one input")
    missing = [i for i in inputs if i not in feeds]
    if missing:
        raise InvalidArgument(f"--auto {source!r} lacks the model inputs {missing}")
    return feeds


def _size(n: int) -> str:
    return f"{n / 1024:.1f} KiB" if n < 1024 * 1024 else f"{n / 1024 / 1024:.2f} MiB"


def cmd_quantize(args) -> int:
    """Run ``onnxrt quantize``; print what changed."""
    from rich.table import Table

    from ..cli.common import console, styled

    from . import QuantFormat, QuantType, CalibrationMethod, quantize_dynamic, quantize_static

    wt = QuantType.from_string(args.weight_type)
    ops = [o.strip() for o in args.op_types.split(",") if o.strip()] if args.op_types else None
    if args.dynamic:
        report = quantize_dynamic(args.model, args.output, op_types_to_quantize=ops, per_channel=args.per_channel,
                                  reduce_range=args.reduce_range, weight_type=wt, nodes_to_exclude=args.exclude)
    else:
        inputs = _model_inputs(args.model)
        batches = read_calibration_dir(args.calibrate, inputs, args.batch_size)
        report = quantize_static(
            args.model, args.output, batches, quant_format=QuantFormat.from_string(args.format),
            op_types_to_quantize=ops, per_channel=args.per_channel, reduce_range=args.reduce_range,
            activation_type=QuantType.from_string(args.activation_type), weight_type=wt,
            nodes_to_exclude=args.exclude, calibrate_method=CalibrationMethod.from_string(args.method),
            calibration_providers=_providers(args.providers), calibration_parallel=args.parallel)
    con = console()  # reads no markup: node names and paths print with their brackets
    kind = "dynamic" if args.dynamic else f"static {report.format}, {args.method}, {args.activation_type} activations"
    con.print(styled((Path(args.model).name, "bold"), f" -> {args.output} ({kind}, {args.weight_type} weights"
                     f"{', per channel' if args.per_channel else ''})"))
    table = Table(title="what changed")
    for col, just in (("op", "left"), ("before", "right"), ("after", "right")):
        table.add_column(col, justify=just)
    for op, b, a in report.op_changes():
        table.add_row(op, str(b), str(a))
    con.print(table)
    con.print(f"nodes quantized: {len(report.quantized)}"
              + (f"; ReLUs folded into the op before them: {len(report.folded)}" if report.folded else ""))
    if report.skipped:
        skipped = Table(title="left in float")
        skipped.add_column("node")
        skipped.add_column("why")
        for node, why in sorted(report.skipped.items()):
            skipped.add_row(node, why)
        con.print(skipped)
    con.print(f"size: {_size(report.size_before)} -> {_size(os.path.getsize(args.output))}")
    return 0


def cmd_float16(args) -> int:
    """Run ``onnxrt float16``; print what changed (with ``--auto``, what stayed float32 and why)."""
    from rich.table import Table

    from ..cli.common import console, styled

    from .float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16, float16_plan
    from .graph import load_input_model, op_counts, save_output_model

    ops = list(DEFAULT_OP_BLOCK_LIST) + list(args.block_op or [])
    con = console()
    original = load_input_model(args.model)
    if args.auto:
        from .mixed_precision import DEFAULT_ATOL, DEFAULT_RTOL, auto_mixed_precision

        feeds = read_feeds(args.auto, _model_inputs(args.model))
        rtol = DEFAULT_RTOL if args.rtol is None else args.rtol
        atol = DEFAULT_ATOL if args.atol is None else args.atol
        rep = auto_mixed_precision(original, feeds, rtol=rtol, atol=atol, keep_io_types=args.keep_io_types,
                                   op_block_list=ops, node_block_list=args.block_node,
                                   providers=_providers(args.providers))
        model, converted, total = rep.model, rep.converted, rep.total
    else:
        if args.rtol is not None or args.atol is not None:
            raise InvalidArgument("--rtol and --atol apply with --auto only")
        model = convert_float_to_float16(original, keep_io_types=args.keep_io_types, op_block_list=ops,
                                         node_block_list=args.block_node)
        plan = float16_plan(original, ops, args.block_node)
        converted, total, rep = sum(plan.values()), len(plan), None
    save_output_model(model, args.output)
    con.print(styled((Path(args.model).name, "bold"), f" -> {args.output}: {converted} of {total} nodes in float16"
                     + (", inputs and outputs kept float32" if args.keep_io_types else "")))
    before, after = op_counts(original), op_counts(model)
    table = Table(title="what changed")
    for col, just in (("op", "left"), ("before", "right"), ("after", "right")):
        table.add_column(col, justify=just)
    for op in sorted(set(before) | set(after)):
        if before.get(op, 0) != after.get(op, 0):
            table.add_row(op, str(before.get(op, 0)), str(after.get(op, 0)))
    con.print(table)
    if rep is not None and not rep.kept:
        con.print(f"kept in float32: none (every node within tolerance, {rep.iterations} round)")
    elif rep is not None:
        kept = Table(title=f"kept in float32 ({len(rep.kept)}, found in {rep.iterations} rounds)")
        for col in ("node", "op", "why", "fp16 max abs err", "fp16 max rel err"):
            kept.add_column(col)
        for k in rep.kept:
            kept.add_row(k.node, k.op_type, k.reason, f"{k.max_abs:.3g}", f"{k.max_rel:.3g}")
        con.print(kept)
    if rep is not None:
        for d in rep.outputs:
            con.print(f"output {d.name}: max abs err {d.max_abs:.3g}, max rel err {d.max_rel:.3g} "
                      f"({'within' if d.ok else 'BEYOND'} rtol {rep.rtol:g}, atol {rep.atol:g})")
    con.print(f"size: {_size(original.ByteSize())} -> {_size(os.path.getsize(args.output))}")
    return 0 if rep is None or rep.ok else 1
