"""Checking a session's outputs: against expected values, as the ONNX backend tests do
(:func:`assert_outputs_close`), and against the CPU provider running the same model
(:func:`compare_with_cpu`).

These are assertions for a provider's tests. ``onnxrt compare`` (:mod:`onnxrt.cli.compare`)
is a different tool: it reports the error per output with a tolerance that follows each
tensor's magnitude, and bisects to the first node that differs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["assert_outputs_close", "compare_with_cpu", "Comparison"]


def _as_comparable(a: np.ndarray) -> np.ndarray:
    # ml_dtypes (bfloat16, float8, int4...) do not promote with Python floats
    if a.dtype.kind == "V" or a.dtype.name in ("bfloat16",) or a.dtype.name.startswith(("float8", "float4", "float6", "int4", "uint4", "int2", "uint2")):
        with np.errstate(over="ignore", invalid="ignore"):  # float8/int4 infinities and NaNs
            return a.astype(np.float32)
    return a


def assert_outputs_close(expected: Any, got: Any, rtol: float = 1e-3, atol: float = 1e-7, where: str = "output") -> None:
    """Assert ``got`` matches ``expected``: same structure, shape and dtype, values within tolerance.

    Sequences (lists) compare element-wise, ``None`` (absent optional) must match,
    strings compare exactly, and dicts (ZipMap rows) compare key by key.
    """
    if isinstance(expected, (list, tuple)):
        assert isinstance(got, (list, tuple)), f"{where}: expected a sequence, got {type(got).__name__}"
        assert len(got) == len(expected), f"{where}: sequence has {len(got)} elements, expected {len(expected)}"
        for i, (e, g) in enumerate(zip(expected, got)):
            assert_outputs_close(e, g, rtol, atol, f"{where}[{i}]")
        return
    if isinstance(expected, dict):
        assert isinstance(got, dict), f"{where}: expected a dict, got {type(got).__name__}"
        assert set(expected) == set(got), f"{where}: keys {sorted(got)} != {sorted(expected)}"
        for k in expected:
            np.testing.assert_allclose(got[k], expected[k], rtol=rtol, atol=atol, err_msg=f"{where}[{k!r}]")
        return
    if expected is None:
        assert got is None, f"{where}: expected an absent optional (None), got {type(got).__name__}"
        return
    expected = np.asarray(expected)
    assert isinstance(got, np.ndarray), f"{where}: expected an array, got {type(got).__name__}"
    assert got.shape == expected.shape, f"{where}: shape {list(got.shape)} != expected {list(expected.shape)}"
    if expected.dtype == object:
        np.testing.assert_array_equal(got, expected, err_msg=where)
        return
    assert got.dtype == expected.dtype, f"{where}: dtype {got.dtype} != expected {expected.dtype}"
    r = rtol
    if got.dtype.name == "bfloat16":
        r = max(rtol, 2**-6)  # two bfloat16 ulps, as the ONNX backend tests allow
    np.testing.assert_allclose(_as_comparable(got), _as_comparable(expected), rtol=r, atol=atol, err_msg=where)


@dataclass
class Comparison:
    """What :func:`compare_with_cpu` ran and found (every output already agreed)."""

    #: the session under test (the providers asked for, with the CPU as fallback)
    session: Any
    feeds: dict[str, Any]
    outputs: list
    expected: list
    #: ``session.get_provider_assignment()``: which provider ran each node, and why
    assignment: list[dict] = field(default_factory=list)


def compare_with_cpu(model, providers, feeds: dict[str, Any] | None = None, rtol: float = 1e-4,
                     atol: float = 1e-5, seed: int = 0, sess_options=None) -> Comparison:
    """Run ``model`` on ``providers`` and on the CPU provider alone; assert every output agrees.

    :param model: a path, bytes or ``onnx.ModelProto``.
    :param providers: the providers under test, as ``InferenceSession`` takes them; the
        CPU provider is appended as the fallback.
    :param feeds: the inputs; random ones (:func:`onnxrt.testing.models.random_feeds`)
        when ``None``.
    """
    import onnx

    from ..session import InferenceSession
    from .models import random_feeds

    if feeds is None:
        if isinstance(model, onnx.ModelProto):
            proto = model
        elif isinstance(model, bytes):
            proto = onnx.load_model_from_string(model)
        else:
            proto = onnx.load(str(model), load_external_data=False)
        feeds = random_feeds(proto, seed=seed)
    providers = [providers] if isinstance(providers, (str, tuple)) else list(providers)
    sess = InferenceSession(model, sess_options=sess_options, providers=providers)
    ref = InferenceSession(model, sess_options=sess_options, providers=["CPUExecutionProvider"])
    got = sess.run(None, feeds)
    expected = ref.run(None, feeds)
    names = [o.name for o in sess.get_outputs()]
    for name, e, g in zip(names, expected, got):
        assert_outputs_close(e, g, rtol, atol, f"output {name!r} on {sess.get_providers()[0]} vs the CPU")
    return Comparison(sess, feeds, got, expected, sess.get_provider_assignment())
