"""String ops against onnxruntime where Python's own string functions read the ONNX
definition differently: RegexFullMatch's RE2 syntax (ASCII classes, POSIX classes,
``\\z``) and StringSplit on empty strings."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

import onnxrt

ort = pytest.importorskip("onnxruntime")

WORDS = np.array(["Hello", "world", "ÄÖÜ", "straße", "", " a b ", "x-y", "FOO", "foo", "123", "a,b", "tab\there",
                  "[x]", "a&b", "Zz9_", "end\n"], dtype=object)


def _model(op, x, n_out=1, **attrs):
    outs = [f"y{i}" for i in range(n_out)]
    graph = helper.make_graph([helper.make_node(op, ["x"], outs, **attrs)], "g",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.STRING, x.shape)],
                              [onnx.ValueInfoProto(name=o) for o in outs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=9).SerializeToString()


def _both(model, x):
    got = onnxrt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    exp = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    return got, exp


@pytest.mark.filterwarnings("error::FutureWarning")  # re's nested-set warnings stay out
@pytest.mark.parametrize("pattern", [
    r"\w+", r"\d+", r"\s.*", r"\W+", r"[^\w]+", r"[\w-]+",  # RE2's classes are ASCII
    r"[[:alpha:]]+", r"[[:^digit:]]+", r"[^[:alpha:]]+", r"[[:alnum:]_]+", r"[[:punct:]]+",
    r"[[:upper:]][[:lower:]]+", r"[[:space:][:digit:]]+",  # POSIX classes
    r"\[[a-z]\]", r"[]a]+", r"[a&]+", r".*\z", r"(?i)foo", r"x\-y", r"[.]+",
])
def test_regex_full_match_reads_re2_syntax(pattern):
    got, exp = _both(_model("RegexFullMatch", WORDS, pattern=pattern), WORDS)
    np.testing.assert_array_equal(got[0], exp[0])


@pytest.mark.parametrize("pattern, what", [(r"\pL+", r"Unicode class \p"), (r"[[:nope:]]", "unknown POSIX class"),
                                           (r"[a[:^digit:]]", "negated POSIX class"), (r"(", "invalid pattern")])
def test_regex_full_match_rejects_what_it_cannot_read(pattern, what):
    with pytest.raises(onnxrt.OnnxRtError, match=what.replace("\\", "\\\\")):
        onnxrt.InferenceSession(_model("RegexFullMatch", WORDS, pattern=pattern), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("attrs", [{"delimiter": ","}, {"delimiter": " "}, {}, {"delimiter": ",", "maxsplit": 1},
                                   {"delimiter": "ab"}])
def test_string_split_counts_no_substring_in_an_empty_string(attrs):
    x = np.array(["", "a,b", "x", " a  b ", "", "a,b,,c"], dtype=object)
    got, exp = _both(_model("StringSplit", x, n_out=2, **attrs), x)
    np.testing.assert_array_equal(got[0], exp[0])
    np.testing.assert_array_equal(got[1], exp[1])
    assert got[1][0] == 0


def _tfidf_model(mode, x_dtype, **attrs):
    graph = helper.make_graph([helper.make_node("TfIdfVectorizer", ["x"], ["y"], mode=mode, **attrs)], "g",
                              [helper.make_tensor_value_info("x", x_dtype, None)], [onnx.ValueInfoProto(name="y")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=9).SerializeToString()


@pytest.mark.parametrize("mode", ["TF", "IDF", "TFIDF"])
@pytest.mark.parametrize("x", [[0, 1], [1, 0], [0, 0, 1], [[0, 1, 1], [1, 1, 5]], [[2, 2, 0, 7, 0, 2], [0, 2, 2, 2, 1, 1]]],
                         ids=["ab", "ba", "aab", "rows", "grams"])
def test_tfidf_n_grams_sharing_an_output_keep_their_own_weights(mode, x):
    """``weights[i]`` belongs to the i-th n-gram of the pool: with two n-grams mapped
    to one output coordinate (``ngram_indexes`` repeating), TFIDF sums each n-gram's
    count times its own weight, and IDF gives the weight of the n-gram found last
    (by skip, then position, then length), as onnxruntime does; before, the output
    coordinate's last weight was applied to every n-gram mapped there."""
    model = _tfidf_model(mode, onnx.TensorProto.INT64, min_gram_length=1, max_gram_length=2, max_skip_count=1,
                         ngram_counts=[0, 3], ngram_indexes=[0, 1, 0, 1, 0], pool_int64s=[0, 1, 2, 2, 2, 0, 2],
                         weights=[2.0, 0.5, 0.25, 3.0, 1.5])
    x = np.asarray(x, np.int64)
    got = onnxrt.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    exp = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(got[0], exp[0], rtol=1e-6)
    assert got[0].shape == exp[0].shape
