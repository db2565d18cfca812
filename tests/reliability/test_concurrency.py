"""Many threads on one session: 8 threads x 200 runs with mixed batch sizes and about
5% bad feeds. Good results equal the sequential ones bit for bit, bad feeds get their
own error, and nothing hangs."""

import threading

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxrt as ort

from ..conftest import make_model

THREADS, RUNS = 8, 200
BATCHES = [0, 1, 3, 8, 17]


def _providers():
    """Every available provider, the CPU provider last."""
    names = ort.get_available_providers()
    return [p for p in names if p != "CPUExecutionProvider"] + ["CPUExecutionProvider"]


def _model():
    """x[N,4], ids[N] -> MatMul/Add/Relu/MatMul + embedding(ids) -> Softmax -> y[N,3]."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
             for n, s in [("w1", (4, 16)), ("b1", (16,)), ("w2", (16, 3)), ("emb", (10, 3))]]
    return make_model(
        [helper.make_node("MatMul", ["x", "w1"], ["h0"]), helper.make_node("Add", ["h0", "b1"], ["h1"]),
         helper.make_node("Relu", ["h1"], ["h2"]), helper.make_node("MatMul", ["h2", "w2"], ["l0"]),
         helper.make_node("Gather", ["emb", "ids"], ["e"]), helper.make_node("Add", ["l0", "e"], ["l"]),
         helper.make_node("Softmax", ["l"], ["y"], axis=-1)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4]),
         helper.make_tensor_value_info("ids", TensorProto.INT64, ["N"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
        inits,
    ).SerializeToString()


def _feed(n, seed):
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((n, 4)).astype(np.float32), "ids": rng.integers(0, 10, n).astype(np.int64)}


def _bad_feed(kind, seed):
    feed = _feed(3, seed)
    if kind == 0:
        feed["x"] = feed["x"].astype(np.float64)            # wrong dtype
    elif kind == 1:
        feed["ids"] = np.array([0, 1, 2, 3], np.int64)      # N disagrees between inputs
    elif kind == 2:
        del feed["ids"]                                      # missing
    else:
        feed["ids"] = np.array([0, 1, 10], np.int64)        # index out of range (at run time)
    return feed


BAD_MATCH = ["input 'x' has dtype float64", "symbolic dimension 'N'", "missing input 'ids'", "Gather node"]


@pytest.mark.parametrize("provider", _providers())
def test_threads_share_one_session(provider):
    sess = ort.InferenceSession(_model(), providers=[provider])
    seeds = {b: 100 + b for b in BATCHES}
    expected = {b: sess.run(None, _feed(b, seeds[b]))[0] for b in BATCHES}
    failures: list[str] = []
    counts = {"good": 0, "bad": 0}
    lock = threading.Lock()
    start = threading.Barrier(THREADS)

    def worker(t):
        rng = np.random.default_rng(t)
        good = bad = 0
        start.wait()
        for i in range(RUNS):
            if rng.random() < 0.05:
                kind = int(rng.integers(0, 4))
                try:
                    sess.run(None, _bad_feed(kind, i))
                    failures.append(f"thread {t} run {i}: bad feed {kind} was accepted")
                except ort.InvalidArgument as e:
                    if BAD_MATCH[kind] not in str(e):
                        failures.append(f"thread {t} run {i}: bad feed {kind} got {e}")
                except Exception as e:  # noqa: BLE001 - any other error is a failure
                    failures.append(f"thread {t} run {i}: bad feed {kind} raised {type(e).__name__}: {e}")
                bad += 1
                continue
            b = BATCHES[int(rng.integers(0, len(BATCHES)))]
            try:
                (y,) = sess.run(None, _feed(b, seeds[b]))
            except Exception as e:  # noqa: BLE001
                failures.append(f"thread {t} run {i}: batch {b} raised {type(e).__name__}: {e}")
                continue
            if y.shape != expected[b].shape or y.tobytes() != expected[b].tobytes():
                failures.append(f"thread {t} run {i}: batch {b} differs from the sequential result")
            good += 1
        with lock:
            counts["good"] += good
            counts["bad"] += bad

    threads = [threading.Thread(target=worker, args=(t,), daemon=True) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    alive = [th.name for th in threads if th.is_alive()]
    assert not alive, f"threads still running after 120 s: {alive}"
    assert not failures, "\n".join(failures[:10])
    assert counts["good"] + counts["bad"] == THREADS * RUNS
    assert counts["bad"] > 0 and counts["good"] > 0.9 * THREADS * RUNS
