"""``onnxrt profile``: a Chrome trace in onnxruntime's schema, a time table, a plot; and
the session's own profiling options behind it."""

import json
import re
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import onnxrt
from onnxrt.cli import main
from onnxrt.run.profiling import load_trace, op_time_table

from .conftest import DIMS, YOLO

NODE_FIELDS = {"cat", "ph", "name", "ts", "dur", "pid", "tid", "args"}


def _node_events(events):
    return [e for e in events if e.get("cat") == "Node"]


def test_profile_writes_a_trace_and_a_table(yolo, tmp_path, capsys):
    trace = tmp_path / "trace.json"
    assert main(["profile", yolo, "--providers", "cpu", "-o", str(trace), "-n", "3", "--top", "5", *DIMS]) == 0
    events = json.loads(trace.read_text())
    assert isinstance(events, list)
    nodes = _node_events(events)
    so = onnxrt.SessionOptions()  # the same fixed dimensions: they let more of the graph fold
    for k, v in (d.split("=") for d in DIMS[1::2]):
        so.add_free_dimension_override_by_name(k, int(v))
    sess = onnxrt.InferenceSession(yolo, so, providers=["cpu"])
    per_run = len(sess.get_provider_assignment())
    assert len(nodes) == 3 * per_run  # the warm-up run is dropped
    for e in nodes:
        assert NODE_FIELDS <= e.keys() and e["ph"] == "X" and e["name"].endswith("_kernel_time")
        assert isinstance(e["ts"], int) and isinstance(e["dur"], int) and e["dur"] >= 0
        assert e["args"]["provider"] == "CPUExecutionProvider" and e["args"]["op_name"]
    per_op = Counter(d["op_type"] for d in sess.get_provider_assignment())
    assert Counter(e["args"]["op_name"] for e in nodes) == Counter({op: 3 * n for op, n in per_op.items()})
    runs = [e for e in events if e["cat"] == "Session" and e["name"] == "model_run"]
    assert len(runs) == 3 and all(e["ph"] == "X" for e in runs)
    # every node event lies within a run
    assert all(any(r["ts"] <= e["ts"] <= r["ts"] + r["dur"] for r in runs) for e in nodes)
    # the model's first convolution (its activation may be fused into it)
    conv = next(e for e in nodes if e["args"]["op_name"] in ("Conv", "FusedConv"))
    assert conv["args"]["output_type_shape"] == [{"float": [1, 8, 32, 48]}]
    out = capsys.readouterr().out
    assert "time per op type, mean of 3 run(s)" in out
    # the op type that takes most of the time (the fused convolutions) with its call
    # count: the other rows' order follows their times
    assert re.search(rf"│ FusedConv\s+│ CPU\s+│\s+{per_op['FusedConv']} │", out)
    assert "more)" in out and f"{per_run} │" in out and str(trace) in out


def test_trace_schema_matches_onnxruntime(yolo, tmp_path):
    rt = pytest.importorskip("onnxruntime")
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    so = rt.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "ort")
    ref = rt.InferenceSession(yolo, so, providers=["CPUExecutionProvider"])
    ref.run(None, {"images": x})
    theirs = _node_events(load_trace(ref.end_profiling()))
    ours_trace = tmp_path / "ours.json"
    assert main(["profile", yolo, "--providers", "cpu", "-o", str(ours_trace), "-n", "1",
                 "--dim", "batch=1", "--dim", "height=32", "--dim", "width=32"]) == 0
    ours = _node_events(load_trace(ours_trace))
    # the fields tools read, with the same types and spellings
    for key in ("cat", "ph", "name", "ts", "dur", "pid", "tid"):
        assert type(ours[0][key]) is type(theirs[0][key]), key
    for key in ("op_name", "provider", "output_size", "output_type_shape"):
        assert key in theirs[0]["args"] and type(ours[0]["args"][key]) is type(theirs[0]["args"][key]), key
    assert {e["ph"] for e in ours} == {e["ph"] for e in theirs} == {"X"}
    # both name the same nodes: "<node name>_kernel_time"; onnxruntime fuses some away
    assert {e["name"] for e in theirs if e["args"]["op_name"] == "Tanh"} == \
        {e["name"] for e in ours if e["args"]["op_name"] == "Tanh"} == {"/Tanh_kernel_time", "/Tanh_1_kernel_time"}
    # and the table reads either trace
    assert {r["op_type"] for r in op_time_table(theirs)} >= {"Conv", "Tanh", "Concat"}


def test_plot_writes_a_png(yolo, tmp_path, capsys):
    png = tmp_path / "ops.png"
    assert main(["profile", yolo, "--providers", "cpu", "-o", str(tmp_path / "t.json"), "-n", "1",
                 "--plot", str(png), *DIMS]) == 0
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    import matplotlib.image

    h, w = matplotlib.image.imread(str(png)).shape[:2]
    assert w == 700 and h > 300
    assert f"plot written to {png}" in capsys.readouterr().out


def test_plot_without_matplotlib_is_a_clear_error(yolo, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    trace = tmp_path / "t.json"
    assert main(["profile", yolo, "--providers", "cpu", "-o", str(trace), "--plot", str(tmp_path / "p.png"),
                 *DIMS]) == 2
    err = capsys.readouterr().err
    assert err == "onnxrt: error: --plot needs matplotlib: pip install 'onnxrt[plot]'\n"
    assert not trace.exists()  # it failed before doing the work


def test_session_profiling_options(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    so = onnxrt.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = "mine"
    sess = onnxrt.InferenceSession(str(YOLO), so, providers=["cpu"])
    assert sess.get_profiling_start_time_ns() > 0
    x = np.zeros((1, 3, 32, 32), np.float32)
    sess.run(None, {"images": x})
    sess.run(None, {"images": x})
    path = sess.end_profiling()
    assert Path(path).name.startswith("mine_") and path.endswith(".json") and Path(path).exists()
    events = load_trace(path)
    names = [e["name"] for e in events if e["cat"] == "Session"]
    assert names.count("model_run") == 2 and len(names) == 3
    assert len(_node_events(events)) == 2 * len(sess.get_provider_assignment())
    # profiling off: nothing is recorded and end_profiling returns ""
    plain = onnxrt.InferenceSession(str(YOLO), providers=["cpu"])
    assert plain.end_profiling() == "" and plain.get_profiling_start_time_ns() == 0


def test_op_time_table_totals():
    events = [
        {"cat": "Node", "ph": "X", "name": "a", "ts": 0, "dur": 30, "args": {"op_name": "Conv", "provider": "P"}},
        {"cat": "Node", "ph": "X", "name": "b", "ts": 40, "dur": 10, "args": {"op_name": "Relu", "provider": "P"}},
        {"cat": "Node", "ph": "X", "name": "a", "ts": 60, "dur": 50, "args": {"op_name": "Conv", "provider": "P"}},
        {"cat": "Session", "ph": "X", "name": "model_run", "ts": 0, "dur": 200, "args": {}},
    ]
    rows = op_time_table(events, runs=2)
    assert [r["op_type"] for r in rows] == ["Conv", "Relu"]
    assert rows[0]["calls"] == 1 and rows[0]["total_us"] == 40 and rows[0]["mean_us"] == 40
    assert rows[0]["share"] == pytest.approx(80 / 90)
