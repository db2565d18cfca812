"""Ray Data: predict_dataset on a real local Ray cluster (two CPUs, shared by the module)."""

import os

import numpy as np
import onnxrt
import pandas as pd
import pytest

from .conftest import CPU, DIGITS_BATCH, batched

ray = pytest.importorskip("ray", reason="the test extra installs ray[data]")
from onnxrt.integrations.ray import PredictorUDF, predict_dataset

BLOCK = 1125  # rows per block; a multiple of every batch size used here


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    ctx = ray.data.DataContext.get_current()
    verbose = ctx.enable_progress_bars
    ctx.enable_progress_bars = False
    try:
        yield
    finally:
        ctx.enable_progress_bars = verbose
        ray.shutdown()


def _dataset(frame: pd.DataFrame):
    """A dataset of BLOCK-row blocks, so batch boundaries fall where the reference's do."""
    return ray.data.from_pandas([frame.iloc[i:i + BLOCK] for i in range(0, len(frame), BLOCK)])


def _error_text(exc: BaseException) -> str:
    """Ray wraps a worker's exception; its text carries the original type and message."""
    return str(exc) + "".join(str(c) for c in (exc.__cause__, getattr(exc, "cause", None)) if c)


def test_each_worker_loads_lazily_and_honours_num_threads(cluster, digits_path, digits_rows):
    predictor = onnxrt.Predictor(digits_path, providers=CPU, num_threads=1)
    rows = digits_rows[:8]

    @ray.remote(num_cpus=1)
    def inspect(p):
        fresh = not p.is_loaded
        label = p({"pixels": rows})["label"]
        return os.getpid(), fresh, p.session.get_session_options().intra_op_num_threads, label

    pid, fresh, threads, label = ray.get(inspect.remote(predictor))
    assert pid != os.getpid() and fresh and threads == 1
    np.testing.assert_array_equal(label, predictor({"pixels": rows})["label"])
    # the UDF builds its session when the actor starts, before any batch
    udf = PredictorUDF(onnxrt.Predictor(digits_path, providers=CPU))
    assert udf.predictor.is_loaded


def test_pandas_batches_match_a_single_process_run_row_for_row(cluster, digits_path, digits_rows):
    frame = pd.DataFrame({"id": np.arange(len(digits_rows)), "image": list(digits_rows)})
    predictor = onnxrt.Predictor(digits_path, providers=CPU, num_threads=1, input_map={"pixels": "image"})
    out = predict_dataset(_dataset(frame), predictor, keep_columns=["id"], batch_size=DIGITS_BATCH, concurrency=2)
    got = out.to_pandas()
    assert len(got) == len(digits_rows) >= 10_000
    assert list(got.columns) == ["id", "label", "probabilities"]
    np.testing.assert_array_equal(got["id"].to_numpy(), np.arange(len(digits_rows)))  # in order
    whole = onnxrt.Predictor(digits_path, providers=CPU, num_threads=1)({"pixels": digits_rows})
    np.testing.assert_array_equal(got["label"].to_numpy(), whole["label"])
    # bitwise: the same provider, thread count and batches in one process
    reference = onnxrt.Predictor(digits_path, providers=CPU, num_threads=1)
    same_batches = batched(reference, digits_rows, DIGITS_BATCH)
    np.testing.assert_array_equal(np.stack(got["probabilities"].to_numpy()), same_batches["probabilities"])


def test_numpy_batches_of_feature_columns_from_an_sklearn_pipeline(cluster, cancer_model):
    model, features = cancer_model
    frame = features.assign(row=np.arange(len(features)))
    predictor = onnxrt.Predictor(model, providers=CPU, num_threads=1, input_map={"X": list(features.columns)})
    out = predict_dataset(_dataset(frame), predictor, keep_columns=["row"], batch_size=BLOCK,
                          batch_format="numpy", concurrency=1)
    got = out.take_batch(len(frame) + 1, batch_format="numpy")
    assert len(got["row"]) == len(frame) >= 10_000
    np.testing.assert_array_equal(got["row"], np.arange(len(frame)))
    want = batched(predictor, frame, BLOCK)
    np.testing.assert_array_equal(got["label"], want["label"])
    np.testing.assert_array_equal(got["probabilities"], want["probabilities"])


def test_missing_input_column_fails_the_dataset_and_names_the_column(cluster, digits_path, digits_rows):
    frame = pd.DataFrame({"img": list(digits_rows[:2 * BLOCK])})
    out = predict_dataset(_dataset(frame), digits_path, providers=CPU, input_map={"pixels": "image"},
                          batch_size=BLOCK, concurrency=1)
    with pytest.raises(Exception) as info:
        out.materialize()
    text = _error_text(info.value)
    assert "InvalidArgument" in text and "no column 'image' (for model input 'pixels')" in text
    assert f"({BLOCK} rows, index " in text


def test_a_failing_batch_surfaces_instead_of_vanishing(cluster, digits_path, digits_rows):
    images = list(digits_rows[:4 * BLOCK])
    images[2 * BLOCK:3 * BLOCK] = [row[:63] for row in digits_rows[2 * BLOCK:3 * BLOCK]]  # the third batch only
    frame = pd.DataFrame({"image": images})
    out = predict_dataset(_dataset(frame), digits_path, providers=CPU, input_map={"pixels": "image"},
                          batch_size=BLOCK, concurrency=1)
    with pytest.raises(Exception) as info:
        out.to_pandas()
    text = _error_text(info.value)
    assert "InvalidArgument" in text and "input 'pixels' has size 63 in dimension 1" in text


def test_settings_and_a_ready_predictor_do_not_mix(digits_path):
    with pytest.raises(onnxrt.InvalidArgument, match="either a Predictor or a model with settings"):
        predict_dataset(None, onnxrt.Predictor(digits_path), num_threads=2)
    with pytest.raises(onnxrt.InvalidArgument, match="batch_format"):
        predict_dataset(None, digits_path, batch_format="pyarrow")


def test_concurrency_must_be_a_pool_size(cluster, digits_path):
    ds = ray.data.from_numpy(np.zeros((4, 64), np.float32))
    with pytest.raises(onnxrt.InvalidArgument, match="concurrency must be a positive int"):
        predict_dataset(ds, digits_path, concurrency=0)
