"""Fuzzing: mutated models and feeds either work or raise an onnxrt error.

Hypothesis drives the mutations in ``model_mutations`` (protobuf fields, shapes,
attributes, dtypes, op types, initializer bytes, raw bytes) over a handful of seed
models, and feeds each session random, sometimes malformed, inputs. Any exception
that is not an :class:`onnxrt.OnnxRtError` fails the test. Deterministic
(``derandomize``, no example database) and bounded for CI; ``scripts/fuzz_models.py``
runs the same mutations for as long as you like.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import onnxrt as ort

from .model_mutations import check_one, make_feeds, mutate_model, seed_models

# NaN and Inf in random feeds make numpy warn; the results are still checked
pytestmark = [pytest.mark.filterwarnings("ignore::RuntimeWarning"),
              # np.matrix feeds are one of the fuzzed kinds; numpy warns that it is not recommended
              pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")]

SEEDS = seed_models()
NAMES = sorted(SEEDS)
BOUNDED = settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def test_every_seed_model_runs():
    import random

    for name in NAMES:
        sess = ort.InferenceSession(SEEDS[name].SerializeToString(), providers=["CPUExecutionProvider"])
        outs = sess.run(None, make_feeds(random.Random(0), sess.get_inputs(), mutate=False))
        assert len(outs) == len(sess.get_outputs()), name
        assert all(isinstance(o, np.ndarray) for o in outs), name


@BOUNDED
@given(name=st.sampled_from(NAMES), rnd=st.randoms(use_true_random=False), n=st.integers(1, 4))
def test_mutated_models_load_and_run_or_raise_onnxrt_errors(name, rnd, n):
    data = mutate_model(rnd, SEEDS[name], n)
    assert check_one(data, rnd, runs=2, run_seconds=0.5) in ("ok", "load-error", "run-error")


@settings(BOUNDED, max_examples=100)
@given(name=st.sampled_from(NAMES), rnd=st.randoms(use_true_random=False))
def test_valid_models_with_fuzzed_feeds(name, rnd):
    sess = ort.InferenceSession(SEEDS[name].SerializeToString(), providers=["CPUExecutionProvider"])
    for _ in range(3):
        feeds = make_feeds(rnd, sess.get_inputs(), mutate=rnd.random() < 0.5)
        try:
            outs = sess.run(None, feeds)
        except ort.OnnxRtError:
            continue
        assert len(outs) == len(sess.get_outputs())


@settings(BOUNDED, max_examples=100)
@given(data=st.binary(max_size=512))
def test_arbitrary_bytes_are_refused_with_onnxrt_errors(data):
    with pytest.raises(ort.OnnxRtError):
        ort.InferenceSession(data)


@settings(BOUNDED, max_examples=100)
@given(name=st.sampled_from(NAMES), cut=st.floats(0.0, 1.0, exclude_max=True))
def test_truncated_seed_models_are_refused_with_onnxrt_errors(name, cut):
    data = SEEDS[name].SerializeToString()
    with pytest.raises(ort.OnnxRtError):
        ort.InferenceSession(data[: int(len(data) * cut)])
