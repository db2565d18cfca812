"""Dask: predict_dataframe and predict_array on a real local cluster of two worker processes."""

import os

import numpy as np
import onnxrt
import pandas as pd
import pytest

from .conftest import CPU, DIGITS_BATCH, batched

dask = pytest.importorskip("dask", reason="the test extra installs dask[array,dataframe]")
distributed = pytest.importorskip("distributed")
import dask.array as da
import dask.dataframe as dd
from onnxrt.integrations.dask import frame_meta, predict_array, predict_dataframe

ROWS_PER_PART = 1125


@pytest.fixture(scope="module")
def client():
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       dashboard_address=None, silence_logs=40)
    c = distributed.Client(cluster)
    try:
        # keep object columns of arrays as arrays (Dask turns them into text by default)
        with dask.config.set({"dataframe.convert-string": False}):
            yield c
    finally:
        c.close()
        cluster.close()


def _frame(digits_rows):
    return pd.DataFrame({"id": np.arange(len(digits_rows)), "image": list(digits_rows)})


def test_dataframe_matches_a_single_process_run_row_for_row(client, digits_path, digits_rows):
    pdf = _frame(digits_rows)
    ddf = dd.from_pandas(pdf, chunksize=DIGITS_BATCH, sort=True)
    assert ddf.npartitions == len(pdf) // DIGITS_BATCH
    predictor = onnxrt.Predictor(digits_path, providers=CPU, num_threads=1, input_map={"pixels": "image"})
    out = predict_dataframe(ddf, predictor, keep_columns=["id"])
    assert list(out.columns) == ["id", "label", "probabilities"]
    assert out.dtypes["label"] == np.int64 and out.dtypes["probabilities"] == object
    got = out.compute()
    assert len(got) == len(digits_rows) >= 10_000
    assert got.index.equals(pdf.index)  # same rows, same order, nothing dropped
    np.testing.assert_array_equal(got["id"].to_numpy(), np.arange(len(digits_rows)))
    whole = onnxrt.Predictor(digits_path, providers=CPU, num_threads=1)({"pixels": digits_rows})
    np.testing.assert_array_equal(got["label"].to_numpy(), whole["label"])
    same_parts = batched(predictor, pdf, DIGITS_BATCH)
    np.testing.assert_array_equal(np.stack(got["probabilities"].to_numpy()), same_parts["probabilities"])


def test_sklearn_pipeline_over_feature_columns(client, cancer_model):
    model, features = cancer_model
    pdf = features.assign(row=np.arange(len(features)))
    ddf = dd.from_pandas(pdf, chunksize=ROWS_PER_PART, sort=True)
    out = predict_dataframe(ddf, model, providers=CPU, num_threads=1,
                            input_map={"X": list(features.columns)}, outputs=["label"], keep_columns=["row"])
    got = out.compute()
    assert list(got.columns) == ["row", "label"] and len(got) == len(pdf) >= 10_000
    reference = onnxrt.Predictor(model, providers=CPU, num_threads=1, input_map={"X": list(features.columns)})
    want = batched(reference, pdf, ROWS_PER_PART)
    np.testing.assert_array_equal(got["row"].to_numpy(), np.arange(len(pdf)))
    np.testing.assert_array_equal(got["label"].to_numpy(), want["label"])


def test_array_blocks_match_a_single_process_run(client, digits_path, digits_rows):
    x = da.from_array(digits_rows, chunks=(DIGITS_BATCH, 32))  # feature axis split on purpose
    probs = predict_array(x, digits_path, output="probabilities", providers=CPU, num_threads=1)
    labels = predict_array(x, digits_path, output="label", providers=CPU, num_threads=1)
    assert probs.shape == (len(digits_rows), 10) and probs.dtype == np.float32
    assert labels.shape == (len(digits_rows),) and labels.dtype == np.int64
    got_probs, got_labels = dask.compute(probs, labels)
    reference = onnxrt.Predictor(digits_path, providers=CPU, num_threads=1)
    want = batched(reference, digits_rows, DIGITS_BATCH)
    np.testing.assert_array_equal(got_probs, want["probabilities"])
    np.testing.assert_array_equal(got_labels, want["label"])


def test_missing_column_fails_before_any_partition_runs(client, digits_path, digits_rows):
    pdf = pd.DataFrame({"img": list(digits_rows[:3 * ROWS_PER_PART])})
    ddf = dd.from_pandas(pdf, chunksize=ROWS_PER_PART, sort=True)
    with pytest.raises(onnxrt.InvalidArgument, match=r"the DataFrame has no column 'image' \(for model input 'pixels'\)"):
        predict_dataframe(ddf, digits_path, providers=CPU, input_map={"pixels": "image"})
    # all columns stacked into a 64-wide input: the count is checked up front as well
    with pytest.raises(onnxrt.InvalidArgument, match="takes 64 features per row but 2 columns"):
        predict_dataframe(ddf.assign(k=1), digits_path, providers=CPU)


def test_a_failing_partition_surfaces_with_its_rows(client, digits_path, digits_rows):
    images = list(digits_rows[:4 * ROWS_PER_PART])
    bad = slice(2 * ROWS_PER_PART, 3 * ROWS_PER_PART)
    images[bad] = [row[:63] for row in digits_rows[bad]]
    ddf = dd.from_pandas(pd.DataFrame({"image": images}), chunksize=ROWS_PER_PART, sort=True)
    out = predict_dataframe(ddf, digits_path, providers=CPU, input_map={"pixels": "image"})
    with pytest.raises(onnxrt.InvalidArgument) as info:
        out.compute()
    assert "partition 2 (1125 rows, index 2250..3374)" in str(info.value)
    assert "input 'pixels' has size 63 in dimension 1" in str(info.value)
    x = da.from_array(digits_rows[:3000, :63], chunks=(1000, 63))
    labels = predict_array(x, digits_path, output="label", providers=CPU)
    with pytest.raises(onnxrt.InvalidArgument, match=r"block \d \(rows \d+\.\.\d+\): input 'pixels' has size 63"):
        labels.compute()


def test_one_session_per_worker_with_the_thread_setting(client, digits_path, digits_rows):
    predictor = onnxrt.Predictor(digits_path, providers=CPU, num_threads=1, input_map={"pixels": "image"})
    ddf = dd.from_pandas(_frame(digits_rows[:4000]), npartitions=8, sort=True)

    def report(part, p):
        before = p.is_loaded
        p(part)
        return pd.DataFrame({"pid": [os.getpid()], "session": [id(p.session)], "loaded_before": [before],
                             "threads": [p.session.get_session_options().intra_op_num_threads]})

    meta = pd.DataFrame({"pid": pd.Series(dtype="int64"), "session": pd.Series(dtype="int64"),
                         "loaded_before": pd.Series(dtype=bool), "threads": pd.Series(dtype="int64")})
    shared = dask.delayed(predictor, pure=True)
    rows = ddf.map_partitions(report, shared, meta=meta).compute()
    assert os.getpid() not in set(rows["pid"])
    assert (rows["threads"] == 1).all()
    # each worker process built exactly one session, reused by all its partitions
    assert (rows.groupby("pid")["session"].nunique() == 1).all()
    assert rows["loaded_before"].sum() == len(rows) - rows["pid"].nunique()
    assert not predictor.is_loaded  # the driver never built one


def test_array_column_turned_into_text_is_named_as_such(digits_path, digits_rows):
    with dask.config.set({"dataframe.convert-string": True}):  # Dask's default
        ddf = dd.from_pandas(pd.DataFrame({"image": list(digits_rows[:20])}), npartitions=2)
    assert ddf.dtypes["image"] != object
    p = onnxrt.Predictor(digits_path, providers=CPU, input_map={"pixels": "image"})
    with pytest.raises(onnxrt.InvalidArgument, match="column 'image' holds text.*dataframe.convert-string"):
        p(ddf.partitions[0].compute())


def test_meta_is_derived_from_the_model_without_a_session(digits_path):
    p = onnxrt.Predictor(digits_path, providers=CPU)
    meta = frame_meta(p, pd.DataFrame({"k": pd.Series(dtype="int32"), "image": pd.Series(dtype=object)}), ["k"])
    assert list(meta.columns) == ["k", "label", "probabilities"] and len(meta) == 0
    assert meta.dtypes.tolist() == [np.dtype("int32"), np.dtype("int64"), np.dtype(object)]
    assert not p.is_loaded
    with pytest.raises(onnxrt.InvalidArgument, match="keep_columns"):
        frame_meta(p, meta, ["absent"])
    with pytest.raises(onnxrt.InvalidArgument, match="needs a dask DataFrame"):
        predict_dataframe(pd.DataFrame(), p)
