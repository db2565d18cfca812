"""``onnxrt explain MODEL``: nodes per provider, fallbacks with reasons, fused groups."""

import re

import onnxrt
from onnxrt.cli import main
from onnxrt.cli.explain import summarize


def _counts(out: str) -> dict:
    return {m[0]: int(m[1]) for m in re.findall(r"│ (\w+ExecutionProvider)\s+│\s+(\d+) │", out)}


def test_counts_add_up_to_the_node_count(yolo, wrong_sigmoid, capsys):
    assert main(["explain", yolo, "--providers", "wrong,cpu"]) == 0
    out = capsys.readouterr().out
    sess = onnxrt.InferenceSession(yolo, providers=["wrong", "cpu"])
    n = len(sess.get_provider_assignment())
    sigmoids = sum(d["op_type"] == "Sigmoid" for d in sess.get_provider_assignment())
    counts = _counts(out)
    assert sigmoids == 21  # one per SiLU and one per score map
    assert counts == {"WrongSigmoidExecutionProvider": sigmoids, "CPUExecutionProvider": n - sigmoids}
    assert sum(counts.values()) == n
    assert re.search(rf"│ total\s+│\s+{n} │", out)
    assert "270 nodes in the model" in out and f"{n} after optimization" in out
    # fallbacks are grouped by op type, with the preferred provider's reason
    assert re.search(r"│ Conv\s+│ \d+\s+│ CPUExecutionProvider\s+│ WrongSigmoidExecutionProvider: no kernel "
                     r"for Conv", out)


def test_single_provider_has_no_fallbacks(yolo, capsys):
    assert main(["explain", yolo, "--providers", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "no fallbacks" in out and list(_counts(out)) == ["CPUExecutionProvider"]


def test_verbose_lists_each_providers_nodes(yolo, wrong_sigmoid, capsys):
    assert main(["explain", yolo, "--providers", "wrong,cpu", "--verbose"]) == 0
    out = capsys.readouterr().out
    assert "WrongSigmoidExecutionProvider: nodes" in out and "CPUExecutionProvider: nodes" in out
    assert "/head8/head8.0/head8.0.2/Sigmoid" in out and "/up/Resize" in out


def test_summarize_groups_fallbacks():
    rows = [{"node": "a", "op_type": "Relu", "provider": "CPU", "reason": "X: no kernel"},
            {"node": "b", "op_type": "Relu", "provider": "CPU", "reason": "X: no kernel"},
            {"node": "c", "op_type": "Add", "provider": "X", "reason": ""}]
    s = summarize(rows)
    assert s["per_provider"] == {"CPU": 2, "X": 1}
    assert s["fallbacks"] == {("Relu", "CPU", "X: no kernel"): ["a", "b"]}
