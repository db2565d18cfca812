"""The published-model suite's own parts, on data made here (no download): the
agreement checks fail where they must, the profile's self times count nothing twice,
and the manifest is whole."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.published import agreement
from benchmarks.published.models import MODELS, get
from benchmarks.published.run import self_times


def test_float32_bound_tells_order_noise_from_a_wrong_kernel():
    b = np.linspace(-3, 3, 1000, dtype=np.float32)
    noise = (b * (1 + 3e-6 * np.sin(np.arange(1000)))).astype(np.float32)  # summation-order sized
    assert agreement.float32_agree("y", noise, b).ok
    wrong = b.copy()
    wrong[17] += 0.01  # one element off by a kernel-bug sized amount
    v = agreement.float32_agree("y", wrong, b)
    assert not v.ok and v.max_abs == pytest.approx(0.01, rel=1e-3)
    assert not agreement.float32_agree("y", b.reshape(1000, 1), b).ok  # shapes must match
    assert not agreement.float32_agree("i", np.array([1, 2]), np.array([1, 3])).ok  # integers: exact


def test_float16_bound_counts_steps_of_the_largest_value():
    b = np.linspace(0, 1, 513, dtype=np.float32)
    step = float(np.spacing(np.float16(1.0)))
    assert agreement.float16_agree("m", b + 7 * step, b).ok
    v = agreement.float16_agree("m", b + 9 * step, b)
    assert not v.ok and "9 steps" in v.detail


def test_quantized_bound_is_onnxruntimes_own_spread():
    rng = np.random.default_rng(0)
    b = rng.standard_normal(4096).astype(np.float32)
    # a runtime whose output moves by up to 0.05 (mean 0.01) when its input moves by 1e-6
    own = (0.05, 0.01)
    flips = b.copy()
    flips[rng.integers(0, 4096, 200)] += 0.08  # rounding flips: larger than float32 noise
    assert agreement.quantized_agree("y", flips, b, own).ok
    broken = b + 0.5  # every element off
    v = agreement.quantized_agree("y", broken, b, own)
    assert not v.ok and "own spread" in v.detail
    # where the spread is nil, the float32 bound still applies
    assert agreement.quantized_agree("y", b * (1 + 1e-6), b, (0.0, 0.0)).ok
    assert not agreement.quantized_agree("y", flips, b, (0.0, 0.0)).ok


def test_spread_perturbs_floats_only_and_by_one_millionth():
    feeds = {"x": np.full((4, 4), 2.0, np.float32), "sr": np.array(16000, np.int64)}
    p = agreement.perturbed(feeds, 0)
    assert p["sr"] is feeds["sr"]
    rel = np.abs(p["x"].astype(np.float64) / 2.0 - 1)
    assert np.all(rel > 0.5e-6) and np.all(rel < 1.5e-6)
    got = agreement.spread(lambda f: [f["x"] * 10], feeds, [feeds["x"] * 10], trials=2)
    assert got[0][0] == pytest.approx(20 * 1e-6, rel=0.2)


def _ev(op, ts, dur, tid=1):
    return {"cat": "Node", "ph": "X", "ts": ts, "dur": dur, "tid": tid, "args": {"op_name": op}}


def test_self_times_leave_out_the_nodes_inside_a_branch():
    events = [_ev("Conv", 0, 10), _ev("If", 10, 50), _ev("Constant", 12, 5), _ev("LSTM", 20, 30),
              _ev("Add", 60, 4), _ev("Relu", 0, 3, tid=2)]
    got = self_times(events)
    assert sorted(got) == sorted([("Conv", 10.0), ("If", 15.0), ("Constant", 5.0), ("LSTM", 30.0),
                                  ("Add", 4.0), ("Relu", 3.0)])
    assert sum(t for op, t in got if op != "Relu") == 64.0  # the wall time in nodes, once


def test_manifest_is_whole():
    keys = [m.key for m in MODELS]
    assert len(keys) == len(set(keys)) >= 15
    kinds = {m.kind for m in MODELS}
    assert len(kinds) >= 7
    assert {m.tolerance for m in MODELS} == {"float32", "quantized", "float16"}
    for m in MODELS:
        assert len(m.sha256) == 64 and len(m.package.sha256) == 64, m.key
        assert m.package.registry in ("pypi", "npm")
        feeds = m.feeds(np.random.default_rng(0))
        assert feeds and all(isinstance(v, np.ndarray) for v in feeds.values()), m.key
    with pytest.raises(KeyError, match="no published model 'nope'"):
        get("nope")


def test_render_reports_both_openblas_passes_and_the_geometric_means():
    from benchmarks.published.run import MARK_END, MARK_START, render

    def lat(ort_ms, ours_ms):
        return {"runs": 10, "onnxruntime_median_ms": ort_ms, "onnxrt_median_ms": ours_ms,
                "onnxruntime_p90_ms": ort_ms, "onnxrt_p90_ms": ours_ms, "ratio_median": ours_ms / ort_ms,
                "ratio_p90": ours_ms / ort_ms}

    keys = ["silero-vad", "magika"]
    res = {"date": "d", "machine": "m", "threads": 2, "seconds": 1.0, "onnxruntime": "x", "numpy": "y",
           "keys": keys, "agree": None,
           "passes": {"as set": {"blas": "Haswell", "env": {"OPENBLAS_CORETYPE": "Haswell"},
                                 "models": {"silero-vad": lat(1.0, 4.0), "magika": lat(2.0, 2.0)}},
                      "unset": {"blas": "SkylakeX", "env": {"OPENBLAS_CORETYPE": None},
                                "models": {"silero-vad": lat(1.0, 2.0), "magika": lat(2.0, 1.0)}}},
           "rss": {"silero-vad": {"onnxrt": {"peak_kb": 1400, "above_start_kb": 400},
                                  "onnxruntime": {"peak_kb": 1000, "above_start_kb": 200}},
                   "magika": {"error": "over 1800 s"}},
           "profile": {"silero-vad": {"ops": [{"op_type": "If", "share": 0.85, "calls": 7}], "nodes_per_run": 209,
                                      "run_us": 2000.0, "node_us": 1900.0, "constant_nodes_per_run": 106,
                                      "outside_nodes_share": 0.05},
                       "magika": {"error": "no runs"}}}
    text = render(res)
    assert text.startswith(MARK_START) and text.endswith(MARK_END)
    assert "pass **as set**: OPENBLAS_CORETYPE=Haswell; OpenBLAS kernel in use: Haswell" in text
    assert "pass **unset**: neither variable set; OpenBLAS kernel in use: SkylakeX" in text
    assert "| silero-vad | streaming audio | 1 | 4 | 4.00 | 4.00 | 2.00 | 1 / 1 | 1.40 | 2.00 |" in text
    assert "latency geometric mean **2.00x** onnxruntime over 2 models; worst 4.00x; 1 of 2 within 2x" in text
    # the unset pass: sqrt(2 * 0.5) = 1
    assert "pass unset: latency geometric mean **1.00x** onnxruntime over 2 models" in text
    assert "peak RSS: worst 1.40x onnxruntime" in text and "over 1800 s" in text
    assert "| silero-vad | 209 (106 Constant) | 2 | 5% | If 85% |" in text
