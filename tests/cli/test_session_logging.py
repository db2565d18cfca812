"""``SessionOptions.log_severity_level`` (0 verbose ... 4 fatal, onnxruntime's scale):
verbose builds show the partition decisions on the ``onnxrt`` logger."""

import logging
import subprocess
import sys

import pytest

import onnxrt

from .conftest import YOLO


def _decisions(records):
    return [r.getMessage() for r in records if r.name == "onnxrt" and " -> " in r.getMessage()]


def test_verbose_severity_shows_every_partition_decision(caplog, wrong_sigmoid):
    so = onnxrt.SessionOptions()
    so.log_severity_level = 0
    # one decision per node partitioned; the fusions after partitioning (level 2 and up)
    # merge nodes, and the assignment would count fewer
    so.graph_optimization_level = onnxrt.GraphOptimizationLevel.ORT_ENABLE_BASIC
    sess = onnxrt.InferenceSession(str(YOLO), so, providers=["wrong", "cpu"])
    decisions = _decisions(caplog.records)
    assert len(decisions) == len(sess.get_provider_assignment())
    assert "node /stem/stem.2/Sigmoid (Sigmoid) -> WrongSigmoidExecutionProvider " in decisions
    conv = next(d for d in decisions if d.startswith("node /stem/stem.0/Conv "))
    assert "-> CPUExecutionProvider (WrongSigmoidExecutionProvider: no kernel for Conv" in conv
    # the logger's own level is back as it was
    assert logging.getLogger("onnxrt").level == logging.NOTSET


@pytest.mark.parametrize("severity", [1, 2, 3, 4])
def test_quieter_severities_hide_them(caplog, severity):
    so = onnxrt.SessionOptions()
    so.log_severity_level = severity
    onnxrt.InferenceSession(str(YOLO), so, providers=["cpu"])
    assert _decisions(caplog.records) == []


def test_bad_severity_is_rejected():
    so = onnxrt.SessionOptions()
    with pytest.raises(onnxrt.InvalidArgument, match="log_severity_level must be 0..4"):
        so.log_severity_level = 7


def test_without_logging_configured_the_decisions_go_to_stderr():
    code = (
        "import onnxrt\n"
        "so = onnxrt.SessionOptions(); so.log_severity_level = 0\n"
        # at the basic level no fusion follows the partition, so the assignment lists
        # the nodes the decisions were logged for
        "so.graph_optimization_level = onnxrt.GraphOptimizationLevel.ORT_ENABLE_BASIC\n"
        f"s = onnxrt.InferenceSession({str(YOLO)!r}, so, providers=['cpu'])\n"
        "print(len(s.get_provider_assignment()))\n"
        "so.log_severity_level = 2\n"
        f"onnxrt.InferenceSession({str(YOLO)!r}, so, providers=['cpu'])\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if " -> CPUExecutionProvider" in ln]
    assert len(lines) == int(r.stdout)  # one per node of the first session only
    assert lines[0].startswith("onnxrt DEBUG: node /stem/stem.0/Conv (Conv) -> CPUExecutionProvider")
