"""onnxrt.Predictor: pickling, lazy sessions, mapping batches to inputs, casts and errors."""

import os
import pickle
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import onnx
import onnxrt
import pandas as pd
import pytest
from onnx import TensorProto, helper
from onnxrt.predictor import outputs_to_frame

from ..conftest import make_model
from .conftest import CPU


def _session_outputs(path_or_bytes, feed):
    sess = onnxrt.InferenceSession(path_or_bytes, providers=CPU)
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feed)))


# -- pickling and the lazy session ------------------------------------------------------
def test_pickle_keeps_the_model_and_settings_but_never_the_session(digits_path, digits_rows):
    p = onnxrt.Predictor(digits_path, providers=CPU, num_threads=1, outputs=["label"])
    first = p({"pixels": digits_rows[:200]})
    assert p.is_loaded
    blob = pickle.dumps(p)
    # a path model pickles as its path and settings: far smaller than the model file
    assert len(blob) < 1000 < os.path.getsize(digits_path)
    q = pickle.loads(blob)
    assert not q.is_loaded
    assert q.model == digits_path and q.session_options().intra_op_num_threads == 1
    again = q({"pixels": digits_rows[:200]})
    assert q.is_loaded and q.session is not p.session
    assert list(again) == ["label"]
    np.testing.assert_array_equal(again["label"], first["label"])


def test_bytes_and_modelproto_pickle_as_bytes(digits_path, digits_rows):
    proto = onnx.load(digits_path)
    feed = {"pixels": digits_rows[:50]}
    want = _session_outputs(digits_path, feed)
    for model in (proto, Path(digits_path).read_bytes()):
        p = pickle.loads(pickle.dumps(onnxrt.Predictor(model, providers=CPU)))
        assert isinstance(p.model, bytes) and p.model == proto.SerializeToString()
        got = p(feed)
        np.testing.assert_array_equal(got["probabilities"], want["probabilities"])


def test_relative_path_is_made_absolute(digits_path, monkeypatch, tmp_path):
    folder, name = os.path.split(digits_path)
    monkeypatch.chdir(folder)
    p = onnxrt.Predictor(name, providers=CPU)
    monkeypatch.chdir(tmp_path)  # a worker may start elsewhere
    assert p.model == digits_path
    assert p({"pixels": np.zeros((2, 64), np.float32)})["label"].shape == (2,)


def test_session_is_built_on_first_call_only(digits_path, digits_rows):
    p = onnxrt.Predictor(digits_path, providers=CPU)
    assert not p.is_loaded
    # describing the model reads it without building a session
    assert [a.name for a in p.input_info()] == ["pixels"]
    assert [a.name for a in p.output_info()] == ["label", "probabilities"]
    assert not p.is_loaded
    p({"pixels": digits_rows[:3]})
    assert p.is_loaded
    session = p.session
    p({"pixels": digits_rows[3:6]})
    assert p.session is session


def test_lazy_creation_is_thread_safe(digits_path, digits_rows, monkeypatch):
    built = []
    real_init = onnxrt.InferenceSession.__init__

    def counting_init(self, *args, **kwargs):
        built.append(threading.get_ident())
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(onnxrt.InferenceSession, "__init__", counting_init)
    p = onnxrt.Predictor(digits_path, providers=CPU, num_threads=1)
    start = threading.Barrier(6)
    results: dict[int, np.ndarray] = {}

    def work(i):
        start.wait()
        results[i] = p({"pixels": digits_rows[i * 10:(i + 1) * 10]})["label"]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(built) == 1
    want = _session_outputs(digits_path, {"pixels": digits_rows[:60]})["label"]
    np.testing.assert_array_equal(np.concatenate([results[i] for i in range(6)]), want)


def test_num_threads_sets_intra_op_threads_and_copies_options(digits_path):
    so = onnxrt.SessionOptions()
    so.graph_optimization_level = onnxrt.GraphOptimizationLevel.ORT_ENABLE_BASIC
    p = onnxrt.Predictor(digits_path, providers=CPU, sess_options=so, num_threads=1)
    so.graph_optimization_level = onnxrt.GraphOptimizationLevel.ORT_DISABLE_ALL  # after the fact: no effect
    got = p.session.get_session_options()
    assert got.intra_op_num_threads == 1
    assert got.graph_optimization_level == onnxrt.GraphOptimizationLevel.ORT_ENABLE_BASIC
    assert so.intra_op_num_threads == 0  # the caller's options are untouched


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "2"])
def test_num_threads_must_be_a_positive_int(digits_path, bad):
    with pytest.raises(onnxrt.InvalidArgument, match="num_threads"):
        onnxrt.Predictor(digits_path, num_threads=bad)


def test_bad_models_are_typed_errors(tmp_path):
    with pytest.raises(onnxrt.NoModel):
        onnxrt.Predictor(None)
    with pytest.raises(onnxrt.NoModel):
        onnxrt.Predictor(b"")
    with pytest.raises(onnxrt.InvalidArgument, match="model must be"):
        onnxrt.Predictor(42)
    missing = onnxrt.Predictor(str(tmp_path / "absent.onnx"))  # lazy: fails where it is used
    with pytest.raises(onnxrt.NoSuchFile, match="absent.onnx"):
        missing({"x": np.zeros(1)})
    with pytest.raises(onnxrt.NoSuchFile):
        missing.input_info()


def test_unknown_output_names_are_an_error(digits_path):
    p = onnxrt.Predictor(digits_path, providers=CPU, outputs=["label", "logits"])
    with pytest.raises(onnxrt.InvalidArgument, match="'logits'.*label, probabilities"):
        p({"pixels": np.zeros((1, 64), np.float32)})
    with pytest.raises(onnxrt.InvalidArgument, match="'logits'"):
        p.output_info()


# -- mapping batches to inputs ----------------------------------------------------------
def test_dataframe_with_one_column_per_feature_is_stacked_and_cast(cancer_model):
    model, frame = cancer_model
    p = onnxrt.Predictor(model, providers=CPU)
    batch = frame.iloc[:500]
    assert (batch.dtypes == np.float64).all()
    got = p(batch)
    want = _session_outputs(model, {"X": batch.to_numpy().astype(np.float32)})
    assert set(got) == {"label", "probabilities"}
    np.testing.assert_array_equal(got["label"], want["label"])
    np.testing.assert_array_equal(got["probabilities"], want["probabilities"])


def test_input_map_chooses_and_orders_columns(cancer_model):
    model, frame = cancer_model
    features = list(frame.columns)
    shuffled = frame.iloc[:300, ::-1].assign(row_id=np.arange(300))  # reordered, plus a non-feature column
    p = onnxrt.Predictor(model, providers=CPU, input_map={"X": features})
    want = _session_outputs(model, {"X": frame.iloc[:300].to_numpy().astype(np.float32)})
    np.testing.assert_array_equal(p(shuffled)["probabilities"], want["probabilities"])
    # without the map, the extra column makes 31 features for a 30-feature input
    with pytest.raises(onnxrt.InvalidArgument, match="takes 30 features per row but 31 columns"):
        onnxrt.Predictor(model, providers=CPU)(shuffled)


def test_column_of_arrays_is_stacked(digits_path, digits_rows):
    rows = digits_rows[:120]
    frame = pd.DataFrame({"image": list(rows), "id": np.arange(120)})
    want = _session_outputs(digits_path, {"pixels": rows})
    got = onnxrt.Predictor(digits_path, providers=CPU, input_map={"pixels": "image"})(frame)
    np.testing.assert_array_equal(got["probabilities"], want["probabilities"])
    # a lone column feeds a single-input model whatever its name; so does a bare array
    p = onnxrt.Predictor(digits_path, providers=CPU)
    np.testing.assert_array_equal(p(frame[["image"]])["label"], want["label"])
    np.testing.assert_array_equal(p({"data": rows})["label"], want["label"])
    np.testing.assert_array_equal(p(rows)["label"], want["label"])
    # several columns that cannot be stacked: the error says which input and how to map it
    with pytest.raises(onnxrt.InvalidArgument, match=r"input_map=\{'pixels': 'image'\}"):
        p(frame)


def test_ragged_array_column_is_a_clear_error(digits_path, digits_rows):
    images = list(digits_rows[:4]) + [digits_rows[4][:60]]
    p = onnxrt.Predictor(digits_path, providers=CPU, input_map={"pixels": "image"})
    with pytest.raises(onnxrt.InvalidArgument, match="'image' holds arrays of different shapes"):
        p(pd.DataFrame({"image": images}))


def test_multi_input_model_by_column_name_with_1d_columns_into_rank2_inputs():
    nodes = [helper.make_node("Mul", ["a", "b"], ["ab"]), helper.make_node("Add", ["ab", "c"], ["y"])]
    model = make_model(
        nodes,
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["N", 1]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, ["N", 1]),
         helper.make_tensor_value_info("c", TensorProto.FLOAT, ["N"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "N"])],
    )
    frame = pd.DataFrame({"b": [1.5, 2.0, -1.0], "a": [2, 3, 4], "c": [0.25, 0.5, 1.0], "note": list("xyz")})
    p = onnxrt.Predictor(model, providers=CPU)
    got = p(frame)["y"]
    a = np.array([[2], [3], [4]], np.float32)
    b = np.array([[1.5], [2.0], [-1.0]], np.float32)
    np.testing.assert_array_equal(got, a * b + np.array([0.25, 0.5, 1.0], np.float32))
    # a column named in input_map that the batch lacks: the error names it and the batch
    mapped = onnxrt.Predictor(model, providers=CPU, input_map={"c": "offset"})
    with pytest.raises(onnxrt.InvalidArgument, match=r"index 0\.\.2\) has no column 'offset' \(for model input 'c'\)"):
        mapped(frame)


def test_only_safe_casts_are_made():
    model = make_model(
        [helper.make_node("Identity", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.INT64, ["N"])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, ["N"])],
    )
    p = onnxrt.Predictor(model, providers=CPU)
    np.testing.assert_array_equal(p({"x": np.array([1, 2], np.int64)})["y"], [1, 2])
    # float into an integer input would truncate: left to the session's dtype error
    with pytest.raises(onnxrt.InvalidArgument, match="dtype float64; the model expects int64"):
        p({"x": np.array([1.5, 2.0])})
    floats = make_model(
        [helper.make_node("Identity", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N"])],
    )
    got = onnxrt.Predictor(floats, providers=CPU)(pd.DataFrame({"x": [1, 2, 16777216]}))["y"]
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, np.array([1, 2, 16777216], np.float32))


def test_missing_input_column_names_the_column_and_the_rows(digits_path, digits_rows):
    p = onnxrt.Predictor(digits_path, providers=CPU, input_map={"pixels": "image"})
    frame = pd.DataFrame({"img": list(digits_rows[:300])}).iloc[100:200]
    with pytest.raises(onnxrt.InvalidArgument) as info:
        p(frame)
    msg = str(info.value)
    assert "no column 'image'" in msg and "'img'" in msg and "100 rows, index 100..199" in msg


def test_column_sources_checks_a_table_without_a_session(cancer_model):
    model, frame = cancer_model
    p = onnxrt.Predictor(model, providers=CPU)
    assert p.column_sources(list(frame.columns)) == {"X": list(frame.columns)}
    mapped = onnxrt.Predictor(model, providers=CPU, input_map={"X": list(frame.columns)[:29] + ["extra"]})
    with pytest.raises(onnxrt.InvalidArgument, match="the table has no column 'extra' \\(for model input 'X'\\)"):
        mapped.column_sources(list(frame.columns), batch_id="the table")
    with pytest.raises(onnxrt.InvalidArgument, match="takes 30 features per row but 29 columns"):
        p.column_sources(list(frame.columns)[:29])
    assert not p.is_loaded and not mapped.is_loaded


def test_failing_batch_keeps_its_error_type_and_names_the_batch(digits_path, digits_rows):
    p = onnxrt.Predictor(digits_path, providers=CPU)
    with pytest.raises(onnxrt.InvalidArgument, match=r"^partition 7: input 'pixels' has size 63 in dimension 1"):
        p({"pixels": digits_rows[:5, :63]}, batch_id="partition 7")
    with pytest.raises(onnxrt.InvalidArgument, match=r"batch \d+ in process \d+ \(2 rows\)"):
        p({"pixels": digits_rows[:2, :63]})
    with pytest.raises(onnxrt.InvalidArgument, match="a batch must be a dict"):
        p([[0.0] * 64])


# -- DataFrames back --------------------------------------------------------------------
def test_predict_frame_keeps_the_index_and_chosen_columns(digits_path, digits_rows):
    frame = pd.DataFrame({"image": list(digits_rows[:50]), "id": np.arange(1000, 1050)},
                         index=pd.RangeIndex(500, 550))
    p = onnxrt.Predictor(digits_path, providers=CPU, input_map={"pixels": "image"})
    out = p.predict_frame(frame, keep_columns=["id"])
    want = _session_outputs(digits_path, {"pixels": digits_rows[:50]})
    assert list(out.columns) == ["id", "label", "probabilities"]
    assert out.index.equals(frame.index)
    np.testing.assert_array_equal(out["id"], frame["id"])
    assert out["label"].dtype == np.int64
    np.testing.assert_array_equal(out["label"], want["label"])
    assert out["probabilities"].dtype == object
    np.testing.assert_array_equal(np.stack(out["probabilities"].to_numpy()), want["probabilities"])
    with pytest.raises(onnxrt.InvalidArgument, match=r"keep_columns \['nope'\]"):
        p.predict_frame(frame, keep_columns=["nope"])


def test_outputs_to_frame_refuses_outputs_that_do_not_match_the_rows():
    with pytest.raises(onnxrt.InvalidArgument, match="output 'y' has 3 rows but the batch has 4"):
        outputs_to_frame({"x": np.zeros(4), "y": np.zeros((3, 2))})
    frame = outputs_to_frame({"x": np.arange(2), "y": np.ones((2, 3))}, index=pd.Index([7, 9]))
    assert list(frame.index) == [7, 9] and frame["y"].iloc[1].tolist() == [1.0, 1.0, 1.0]


# -- optional engines -------------------------------------------------------------------
@pytest.mark.parametrize("engine, extra", [("ray", "onnxrt[ray]"), ("dask", "onnxrt[dask]")])
def test_missing_engine_is_an_import_error_naming_the_extra(engine, extra):
    code = f"import sys; sys.modules[{engine!r}] = None\nimport onnxrt.integrations.{engine}"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode != 0
    assert "ImportError" in proc.stderr and f"pip install '{extra}'" in proc.stderr
