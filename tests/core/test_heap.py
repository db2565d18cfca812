"""The heap thresholds (onnxrt.run.malloc): runs with mid-sized intermediates stop page-faulting.

Each case runs in a fresh interpreter, since the setting is per process and made once.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or os.confstr("CS_GNU_LIBC_VERSION") is None,
    reason="the thresholds are glibc's",
)

# Six elementwise ops on one 128x512 float32 input (256 KiB each), summed: every
# intermediate is above glibc's initial 128 KiB mmap threshold, none is large enough
# to raise it far, and the six freed together leave more free heap than glibc keeps,
# so it is returned to the system and faulted in again on every run.
_SCRIPT = textwrap.dedent(
    """
    import json, resource, sys
    import numpy as np
    import onnx
    from onnx import TensorProto, helper
    import onnxrt
    from onnxrt.run.malloc import heap_tuned

    ops = ("Relu", "Neg", "Exp", "Sigmoid", "Abs", "Tanh")
    nodes = [helper.make_node(op, ["x"], [f"t{i}"]) for i, op in enumerate(ops)]
    nodes.append(helper.make_node("Sum", [f"t{i}" for i in range(len(ops))], ["y"]))
    g = helper.make_graph(nodes, "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [128, 512])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [128, 512])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    so = onnxrt.SessionOptions()
    so.intra_op_num_threads = 1
    for k, v in json.loads(sys.argv[1]).items():
        so.add_session_config_entry(k, v)
    s = onnxrt.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((128, 512)).astype(np.float32)
    want = np.maximum(x, 0) - x + np.exp(x) + 1 / (1 + np.exp(-x)) + np.abs(x) + np.tanh(x)
    for _ in range(5):
        y, = s.run(None, {"x": x})
    np.testing.assert_allclose(y, want, rtol=1e-6)
    r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(50):
        s.run(None, {"x": x})
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0) / 50
    print(json.dumps({"tuned": heap_tuned(), "faults_per_run": faults}))
    """
)


def _run(config: dict | None = None, env: dict | None = None, pinned_defaults: bool = False) -> dict:
    import json

    full_env = {**os.environ, **(env or {})}
    full_env.pop("MALLOC_MMAP_THRESHOLD_", None)
    full_env.pop("MALLOC_TRIM_THRESHOLD_", None)
    full_env.pop("MALLOC_TOP_PAD_", None)
    if pinned_defaults:
        full_env["MALLOC_MMAP_THRESHOLD_"] = full_env["MALLOC_TRIM_THRESHOLD_"] = str(128 * 1024)
    out = subprocess.run(
        [sys.executable, "-c", _SCRIPT, json.dumps(config or {})],
        capture_output=True, text=True, env=full_env, timeout=120, check=False,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_tuned_heap_runs_without_page_faults():
    r = _run()
    assert r["tuned"] is True
    # 7 arrays of 64 pages each: ~450 faults per run untuned
    assert r["faults_per_run"] < 20, r


def test_untuned_heap_faults_every_run():
    """The control: glibc's defaults page-fault on every run of this model, which is
    what the tuning removes (and shows that the measurement above can fail).

    The defaults are pinned (128 KiB each, glibc's initial values): left dynamic, any
    block of more than 128 KiB that the interpreter maps and frees before the runs
    (compiling a module at import is enough) raises them, and whether the control
    faults would depend on which modules the package happens to import."""
    r = _run(env={"ONNXRT_TUNE_HEAP": "0"}, pinned_defaults=True)
    assert r["tuned"] is False
    assert r["faults_per_run"] > 200, r


def test_config_entry_turns_it_off():
    r = _run(config={"session.tune_heap": "0"})
    assert r["tuned"] is False
