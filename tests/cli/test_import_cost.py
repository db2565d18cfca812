"""The runtime loads none of the command line's dependencies.

``import onnxrt``, building a session and running it must not import ``rich``,
matplotlib, the ``onnxrt.cli`` package or the pytest plugin: each check runs in a fresh
interpreter, so modules that other tests imported do not count.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

# what a plain session must not load: the command line's modules, and flatbuffers (read only for LoRA adapters)
CLI_ONLY = ("rich", "matplotlib", "onnxrt.cli", "onnxrt.testing", "pytest", "flatbuffers")


def _loaded_after(code: str, cwd) -> dict:
    """Run ``code`` in a fresh interpreter in ``cwd``; it sets ``result``; return it with
    the modules of ``CLI_ONLY`` (or under them) that were imported."""
    script = textwrap.dedent(code) + textwrap.dedent(f"""
        import json, sys
        roots = {CLI_ONLY!r}
        loaded = sorted(m for m in sys.modules if any(m == r or m.startswith(r + ".") for r in roots))
        print(json.dumps({{"loaded": loaded, "result": result}}))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_session_run_imports_nothing_of_the_command_line(tmp_path):
    got = _loaded_after("""
        from importlib import resources

        import numpy as np
        import onnxrt

        demo = resources.files("onnxrt") / "demo"
        held = np.load(str(demo / "digits_holdout.npz"))
        so = onnxrt.SessionOptions()
        so.enable_profiling = True  # the profiler is the runtime's, not the CLI's
        sess = onnxrt.InferenceSession(str(demo / "digits_mlp.onnx"), so, providers=["cpu"])
        label, prob = sess.run(None, {"pixels": held["pixels"]})
        import os
        os.remove(sess.end_profiling())
        result = float((label == held["labels"]).mean())
    """, tmp_path)
    assert got["loaded"] == []
    assert got["result"] > 0.9  # the run computed real predictions


def test_the_command_line_imports_rich_but_plots_only_when_asked(tmp_path):
    got = _loaded_after("""
        import contextlib, io
        from onnxrt.cli import main

        with contextlib.redirect_stdout(io.StringIO()) as out:
            status = main(["run"])
        result = [status, "accuracy: " in out.getvalue()]
    """, tmp_path)
    assert got["result"] == [0, True]
    assert "rich" in got["loaded"] and "onnxrt.cli" in got["loaded"]
    assert not any(m.startswith("matplotlib") for m in got["loaded"])
    assert not any(m == "onnxrt.testing" or m.startswith(("onnxrt.testing.", "pytest")) for m in got["loaded"])


def test_the_testing_tools_import_neither_pytest_nor_the_command_line(tmp_path):
    got = _loaded_after("""
        from onnxrt.testing import compare_with_cpu, models

        result = len(compare_with_cpu(models.mlp(), ["cpu"]).outputs)
    """, tmp_path)
    assert got["result"] == 1
    assert got["loaded"] == ["onnxrt.testing", "onnxrt.testing.models", "onnxrt.testing.nodetests",
                             "onnxrt.testing.outputs"]
