"""Calibration batches run on Dask or Ray workers give the ranges a single process gives."""

import pytest

from onnxrt.quantization import CalibrationMethod, NumpyDataReader, collect_ranges, quantize_static
from onnxrt.quantization.graph import GraphIndex
from onnxrt.quantization.plan import calibration_tensors, select_nodes


def _tensors(model):
    return calibration_tensors(GraphIndex(model), select_nodes(model, None, None, None))


@pytest.mark.parametrize("method", [CalibrationMethod.MinMax, CalibrationMethod.Entropy,
                                    CalibrationMethod.Percentile], ids=lambda m: m.name)
def test_dask_calibration_gives_the_single_process_ranges(cnn, method):
    pytest.importorskip("dask", reason="parallel calibration on Dask needs dask installed")
    model, cal, _ = cnn
    tensors = _tensors(model)
    # small chunks: several waves of tasks, merged in order
    opts = {"CalibParallelChunk": 3}
    serial = collect_ranges(model, NumpyDataReader({"x": cal}, 8), tensors, method)
    parallel = collect_ranges(model, NumpyDataReader({"x": cal}, 8), tensors, method, extra_options=opts,
                              parallel="dask")
    assert parallel == serial and len(serial) == len(tensors)


def test_moving_average_is_taken_in_batch_order_on_a_distributed_client(cnn):
    distributed = pytest.importorskip("distributed", reason="a Dask client needs dask.distributed installed")
    model, cal, _ = cnn
    tensors = _tensors(model)
    opts = {"CalibMovingAverage": True, "CalibMovingAverageConstant": 0.3}
    serial = collect_ranges(model, NumpyDataReader({"x": cal}, 8), tensors, CalibrationMethod.MinMax,
                            extra_options=opts)
    with distributed.Client(processes=False, n_workers=1, threads_per_worker=2, dashboard_address=None) as client:
        par = collect_ranges(model, NumpyDataReader({"x": cal}, 8), tensors, CalibrationMethod.MinMax,
                             extra_options={**opts, "CalibParallelChunk": 4}, parallel=client)
        r = quantize_static(model, None, NumpyDataReader({"x": cal}, 8), calibration_parallel=client)
        # "dask" finds the running client (the predictor is scattered to its workers once)
        by_name = collect_ranges(model, NumpyDataReader({"x": cal}, 8), tensors, CalibrationMethod.MinMax,
                                 extra_options={**opts, "CalibParallelChunk": 4}, parallel="dask")
    assert par == serial == by_name
    plain = collect_ranges(model, NumpyDataReader({"x": cal}, 8), tensors, CalibrationMethod.MinMax)
    assert any(par[t] != plain[t] for t in tensors)  # the moving average is not the plain range
    assert r.ranges == plain


@pytest.mark.slow
def test_ray_calibration_gives_the_single_process_ranges(cnn):
    ray = pytest.importorskip("ray", reason="parallel calibration on Ray needs ray installed")
    model, cal, _ = cnn
    tensors = _tensors(model)
    serial = collect_ranges(model, NumpyDataReader({"x": cal}, 8), tensors, CalibrationMethod.Entropy)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        par = collect_ranges(model, NumpyDataReader({"x": cal}, 8), tensors, CalibrationMethod.Entropy,
                             parallel="ray")
    finally:
        ray.shutdown()
    assert par == serial


def test_a_progress_bar_counts_the_batches_on_a_terminal(cnn, monkeypatch, capsys):
    model, cal, _ = cnn
    monkeypatch.setenv("TTY_COMPATIBLE", "1")  # rich: treat stderr as a terminal
    monkeypatch.setenv("TTY_INTERACTIVE", "1")
    collect_ranges(model, NumpyDataReader({"x": cal}, 8), ["c1"], CalibrationMethod.MinMax)
    err = capsys.readouterr().err
    assert "calibrating" in err and "8/8" in err
    collect_ranges(model, NumpyDataReader({"x": cal}, 8), ["c1"], CalibrationMethod.MinMax, show_progress=False)
    assert "calibrating" not in capsys.readouterr().err
