"""The onnx package's other backend test models: ``simple``, ``pytorch-converted`` and
``pytorch-operator``, each a model with input/output protobufs, run through the session."""

import glob
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import onnxrt as ort
from onnxrt.testing import assert_outputs_close

BASE = Path(onnx.__file__).parent / "backend" / "test" / "data"
DIRS = sorted(p for kind in ("simple", "pytorch-converted", "pytorch-operator") for p in (BASE / kind).glob("test_*"))


def _load(path):
    """A test data protobuf: a tensor, a sequence, a map or an optional."""
    data = Path(path).read_bytes()
    for proto_type, convert in (
        (onnx.TensorProto, numpy_helper.to_array),
        (onnx.SequenceProto, numpy_helper.to_list),
        (onnx.OptionalProto, numpy_helper.to_optional),
    ):
        proto = proto_type()
        try:
            proto.ParseFromString(data)
        except Exception:  # noqa: BLE001 - try the next message type
            continue
        if proto_type is onnx.TensorProto and not proto.name and not proto.dims and not proto.data_type:
            continue
        return convert(proto)
    raise AssertionError(f"cannot decode {path}")


def _names(model):
    inits = {t.name for t in model.graph.initializer}
    return [vi.name for vi in model.graph.input if vi.name not in inits]


def test_the_onnx_package_ships_these_models():
    assert len(DIRS) > 100


@pytest.mark.parametrize("case", DIRS, ids=[f"{d.parent.name}/{d.name}" for d in DIRS])
def test_model_dir(case):
    model = onnx.load(case / "model.onnx")
    sess = ort.InferenceSession(str(case / "model.onnx"), providers=["CPUExecutionProvider"])
    names = _names(model)
    for ds in sorted(glob.glob(str(case / "test_data_set_*"))):
        inputs = [_load(p) for p in sorted(glob.glob(os.path.join(ds, "input_*.pb")), key=_index)]
        expected = [_load(p) for p in sorted(glob.glob(os.path.join(ds, "output_*.pb")), key=_index)]
        with np.errstate(all="ignore"):
            got = sess.run(None, dict(zip(names, inputs)))
        for vi, e, g in zip(model.graph.output, expected, got):
            assert_outputs_close(e, g, rtol=1e-3, atol=1e-7, where=f"{case.name}:{vi.name}")


def _index(path):
    return int(Path(path).stem.split("_")[-1])
