"""``onnxrt bench``: median, p90 and throughput, and the ratio to onnxruntime."""

import re

import pytest

from onnxrt.cli import main
from onnxrt.cli.bench import latency_stats

from .conftest import DIMS


def _row(out, engine):
    m = re.search(rf"│ {engine}\s+│\s+([\d.]+) │\s+([\d.]+) │\s+([\d.]+) │\s+([\d.]+) │\s+([\d.]+) │\s+([\d.]+) │", out)
    assert m, out
    return [float(v) for v in m.groups()]


def test_bench_prints_latency_and_throughput(yolo, capsys):
    assert main(["bench", yolo, "--providers", "cpu", "-n", "5", "--warmup", "1", "--threads", "1",
                 "--dim", "batch=2", "--dim", "height=32", "--dim", "width=32"]) == 0
    out = capsys.readouterr().out
    assert "5 runs after 1 warm-up, 1 thread(s), batch 2" in out
    median, p90, mean, low, rps, ips = _row(out, "onnxrt")
    assert 0 < low <= median <= p90
    assert rps == pytest.approx(1000 / median, rel=0.01) and ips == pytest.approx(2 * rps, rel=0.01)
    assert "ratio" not in out


def test_bench_compare_onnxruntime_prints_a_ratio(yolo, capsys):
    pytest.importorskip("onnxruntime")
    assert main(["bench", yolo, "--providers", "cpu", "-n", "5", "--warmup", "1", "--threads", "1",
                 "--compare", "onnxruntime", *DIMS]) == 0
    out = capsys.readouterr().out
    ours, theirs = _row(out, "onnxrt")[0], _row(out, "onnxruntime")[0]
    m = re.search(r"ratio onnxrt/onnxruntime \(median\): ([\d.]+) \(onnxrt is ([\d.]+)x (slower|faster)\)", out)
    assert m
    ratio = float(m.group(1))
    assert ratio == pytest.approx(ours / theirs, rel=0.02)
    assert m.group(3) == ("slower" if ratio > 1 else "faster")


def test_bad_run_count(yolo, capsys):
    assert main(["bench", yolo, "-n", "0", *DIMS]) == 2
    assert "-n must be at least 1" in capsys.readouterr().err


def test_latency_stats():
    s = latency_stats([0.001, 0.002, 0.003, 0.004, 0.010], batch=4)
    assert s["median_ms"] == pytest.approx(3.0) and s["min_ms"] == pytest.approx(1.0)
    assert s["p90_ms"] == pytest.approx(7.6) and s["runs_per_s"] == pytest.approx(1000 / 3)
    assert s["items_per_s"] == pytest.approx(4000 / 3) and s["runs"] == 5
