"""The generated CUDA C for elementwise chains, checked without a GPU.

- the source text: parameters, dtypes, half handling, one statement per node;
- the semantics: every generated body is compiled as C++ with the host compiler and run
  on inputs with NaN, infinities and signed zeros, and must match the CPU provider running
  the same ONNX nodes; the numpy evaluation of the same chain (the fallback path) must too;
- where ``nvcc`` is installed, the bodies, the depthwise kernel and the hand-written
  kernels of ``onnxrt_cuda.raw`` compile as CUDA.
"""

import shutil
import subprocess

import numpy as np
import onnxrt as ort
import pytest
from onnx import TensorProto, helper
from onnxrt_cuda.codegen import CTYPES, OPS, EwNode, EwProgram, fusable
from onnxrt_cuda.kernels import DEPTHWISE_SOURCE
from onnxrt_cuda.raw import SOURCE as RAW_SOURCE

F32 = np.float32
ONNX_T = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE,
          np.dtype(np.float16): TensorProto.FLOAT16, np.dtype(np.bool_): TensorProto.BOOL,
          np.dtype(np.int32): TensorProto.INT32, np.dtype(np.int64): TensorProto.INT64}


def _data(dt, seed, n=24, positive=False):
    rng = np.random.default_rng(seed)
    dt = np.dtype(dt)
    if dt == np.bool_:
        return rng.random(n) < 0.5
    if dt.kind == "i":
        return rng.integers(-50, 50, n).astype(dt)
    v = rng.standard_normal(n) * 3
    v[:6] = [0.0, -0.0, 0.5, -2.5, 7.25, -1e-3]
    if positive:
        v = np.abs(v) + 0.1
    return v.astype(dt)


def _specials(dt):
    return np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.5], dtype=dt)


# (name, chain as (op, inputs, attrs), input dtypes, positive inputs, with NaN/inf inputs)
CASES = [
    ("add", [("Add", ["a", "b"], {})], [F32, F32], False, True),
    ("sub_mul_div", [("Sub", ["a", "b"], {}), ("Mul", ["t0", "a"], {}), ("Div", ["t1", "b"], {})], [F32, F32], False, False),
    ("relu_sigmoid", [("Relu", ["a"], {}), ("Sigmoid", ["t0"], {})], [F32], False, True),
    ("leaky_elu", [("LeakyRelu", ["a"], {"alpha": 0.1}), ("Elu", ["t0"], {"alpha": 0.7})], [F32], False, True),
    ("tanh_exp_log", [("Tanh", ["a"], {}), ("Exp", ["t0"], {}), ("Log", ["t1"], {})], [F32], False, True),
    ("sqrt_recip", [("Sqrt", ["a"], {}), ("Reciprocal", ["t0"], {})], [F32], True, False),
    ("abs_neg_floor_ceil", [("Abs", ["a"], {}), ("Neg", ["t0"], {}), ("Floor", ["t1"], {}), ("Ceil", ["a"], {}),
                            ("Add", ["t2", "t3"], {})], [F32], False, True),
    ("round_half_even", [("Round", ["a"], {})], [F32], False, True),
    ("trig", [("Sin", ["a"], {}), ("Cos", ["t0"], {}), ("Tan", ["t1"], {})], [F32], False, False),
    ("erf_gelu", [("Erf", ["a"], {}), ("Gelu", ["a"], {}), ("Add", ["t0", "t1"], {})], [F32], False, True),
    ("gelu_tanh", [("Gelu", ["a"], {"approximate": "tanh"})], [F32], False, False),
    ("hard_sigmoid_swish", [("HardSigmoid", ["a"], {"alpha": 0.3, "beta": 0.4}), ("HardSwish", ["t0"], {})], [F32], False, True),
    ("softplus_softsign", [("Softplus", ["a"], {}), ("Softsign", ["t0"], {})], [F32], False, True),
    ("max_min_nan", [("Max", ["a", "b"], {}), ("Min", ["t0", "b"], {})], [F32, F32], False, True),
    ("max3", [("Max", ["a", "b", "c"], {})], [F32, F32, F32], False, False),
    ("pow", [("Pow", ["a", "b"], {})], [F32, F32], True, False),
    ("clip", [("Clip", ["a", "b", "c"], {})], [F32, F32, F32], False, False),
    # omitted bounds are the type's finite limits: infinities clamp to them
    ("clip_no_bounds", [("Clip", ["a"], {})], [F32], False, True),
    ("clip_min_only", [("Clip", ["a", "b"], {})], [F32, F32], False, True),
    ("clip_max_only", [("Clip", ["a", "", "b"], {})], [F32, F32], False, True),
    ("clip_no_bounds_double", [("Clip", ["a"], {})], [np.float64], False, True),
    ("compare_where", [("Less", ["a", "b"], {}), ("Where", ["t0", "a", "b"], {})], [F32, F32], False, True),
    ("logic", [("Greater", ["a", "b"], {}), ("Equal", ["a", "a"], {}), ("And", ["t0", "t1"], {}), ("Not", ["t2"], {}),
               ("Or", ["t3", "t0"], {})], [F32, F32], False, True),
    ("cast_int_back", [("Cast", ["a"], {"to": TensorProto.INT32}), ("Cast", ["t0"], {"to": TensorProto.FLOAT})], [F32], False, False),
    ("cast_bool", [("Cast", ["a"], {"to": TensorProto.BOOL})], [F32], False, True),
    ("int_arith", [("Add", ["a", "b"], {}), ("Mul", ["t0", "a"], {}), ("Sub", ["t1", "b"], {})],
     [np.int64, np.int64], False, False),
    ("double", [("Mul", ["a", "b"], {}), ("Tanh", ["t0"], {}), ("Add", ["t1", "a"], {})], [np.float64, np.float64], False, True),
]


def _build(case):
    name, chain, dts, positive, specials = case
    ins = ["a", "b", "c"][: len(dts)]
    nodes, ew = [], []
    for k, (op, inputs, attrs) in enumerate(chain):
        out = f"t{k}"
        nodes.append(helper.make_node(op, inputs, [out], name=f"n{k}", **attrs))
        ew.append(EwNode(op, inputs, [out], attrs, f"n{k}"))
    prog = EwProgram(ew, ins, [f"t{len(chain) - 1}"])
    arrays = [_data(dt, seed=i, positive=positive) for i, dt in enumerate(dts)]
    if specials:
        arrays = [np.concatenate([_specials(a.dtype), a]) if a.dtype.kind == "f" else a for a in arrays]
    if chain[0][0] == "Clip":
        # min and max are scalars
        arrays = [arrays[0]] + [np.array(v, dtype=d) for v, d in zip((-1.0, 2.0), dts[1:])]
    out_dt = prog.dtypes([a.dtype for a in arrays])[prog.outputs[0]]
    g = helper.make_graph(nodes, name, [helper.make_tensor_value_info(n, ONNX_T[a.dtype], list(a.shape)) for n, a in zip(ins, arrays)],
                          [helper.make_tensor_value_info(prog.outputs[0], ONNX_T[out_dt], [len(arrays[0])])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with np.errstate(all="ignore"):
        want = sess.run(None, dict(zip(ins, arrays)))[0]
    return prog, arrays, want


def _check(got, want, dt):
    dt = np.dtype(dt)
    if dt.kind == "f":
        tol = 2e-6 if dt == np.float32 else 1e-12
        np.testing.assert_allclose(got.astype(dt), want, rtol=tol, atol=tol, equal_nan=True)
        # signed zeros and infinities exactly
        assert np.array_equal(np.signbit(got[np.isinf(want)]), np.signbit(want[np.isinf(want)]))
    else:
        np.testing.assert_array_equal(got.astype(dt), want)


def test_source_text():
    prog = EwProgram([EwNode("Mul", ["x", "w"], ["m"]), EwNode("Relu", ["m"], ["y"])], ["x", "w"], ["y"])
    in_p, out_p, body, name = prog.source([np.float32, np.float32])
    assert in_p == "float32 x0, float32 x1" and out_p == "float32 y0"
    assert body.splitlines() == [
        "const float v0 = (float)(((float)((x0) * (x1))));  // Mul",
        "const float v1 = (float)(((v0) < (float)0 ? (float)0 : (v0)));  // Relu",
        "y0 = (float)(v1);",
    ]
    assert name.startswith("onnxrt_ew_mul_relu_")
    # the source depends on the dtypes, not on sizes: one compile per signature
    assert prog.source([np.float64, np.float64])[0] == "float64 x0, float64 x1"
    assert prog.source([np.float32, np.float32]) == (in_p, out_p, body, name)


def test_float16_loads_widen_and_stores_round_once():
    prog = EwProgram([EwNode("Add", ["x", "x"], ["s"]), EwNode("Tanh", ["s"], ["y"])], ["x"], ["s", "y"])
    in_p, out_p, body, _ = prog.source([np.float16])
    assert in_p == "float16 x0" and out_p == "float16 y0, float16 y1"
    assert "((float)x0)" in body and "const float v1" in body
    assert body.endswith("y0 = (float16)(v0);\ny1 = (float16)(v1);")


def test_attributes_are_literals():
    prog = EwProgram([EwNode("LeakyRelu", ["x"], ["y"], {"alpha": 0.25})], ["x"], ["y"])
    assert "((float)0.25)" in prog.source([np.float32])[2]
    assert "((double)0.25)" in prog.source([np.float64])[2]


def test_fusable_refuses_with_reasons():
    assert fusable("Add", "", [np.dtype(F32)] * 2, {}) is None
    assert "not an elementwise op" in fusable("Conv", "", [np.dtype(F32)] * 2, {})
    assert "not fused" in fusable("Div", "", [np.dtype(np.int32)] * 2, {})  # C traps on x / 0
    assert "mixed input types" in fusable("Add", "", [np.dtype(F32), np.dtype(np.float64)], {})
    assert "not fused" in fusable("Clip", "", [np.dtype(F32)], {"min": 0.0})
    assert fusable("Cast", "", [np.dtype(F32)], {"to": TensorProto.STRING}) is not None
    assert "com.microsoft" in fusable("Gelu", "com.microsoft", [np.dtype(F32)], {})
    assert set(OPS) >= {"Add", "Relu", "Sigmoid", "Gelu", "Where", "Cast", "Clip"}


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_numpy_evaluation_matches_cpu_provider(case):
    prog, arrays, want = _build(case)
    (got,) = prog.evaluate(np, arrays)
    assert got.dtype == want.dtype
    _check(got, want, want.dtype)


def _c_literal(v, dt):
    dt = np.dtype(dt)
    if dt == np.bool_:
        return "true" if v else "false"
    if dt.kind in "iu":
        return f"{int(v)}LL"
    f = float(v)
    if np.isnan(f):
        return "NAN"
    if np.isinf(f):
        return "INFINITY" if f > 0 else "-INFINITY"
    return f"{f.hex()}" + ("f" if dt == np.float32 else "")


def _harness(progs) -> str:
    out = ["#include <math.h>", "#include <stdio.h>", "using namespace std;"]
    for k, (prog, arrays, want) in enumerate(progs):
        body = prog.source([a.dtype for a in arrays])[2]
        n = len(arrays[0])
        out.append(f"static void case{k}() {{")
        for j, a in enumerate(arrays):
            ct = CTYPES[a.dtype][1]
            out.append(f"  static const {ct} X{j}[{a.size}] = {{{', '.join(_c_literal(v, a.dtype) for v in a.reshape(-1))}}};")
        ot = CTYPES[want.dtype][1]
        out.append(f"  for (int i = 0; i < {n}; ++i) {{")
        for j, a in enumerate(arrays):
            out.append(f"    const {CTYPES[a.dtype][1]} x{j} = X{j}[{'i' if a.ndim else '0'}];")
        out.append(f"    {ot} y0;")
        out.extend("    " + line for line in body.splitlines())
        if want.dtype.kind == "f":
            out.append('    printf("%a\\n", (double)y0);')
        else:
            out.append('    printf("%lld\\n", (long long)y0);')
        out.append("  }")
        out.append("}")
    out.append("int main() {")
    out.extend(f'  printf("#\\n"); case{k}();' for k in range(len(progs)))
    out.append("  return 0;\n}")
    return "\n".join(out)


@pytest.mark.skipif(shutil.which("g++") is None, reason="no host C++ compiler")
def test_generated_c_matches_cpu_provider(tmp_path):
    built = [_build(c) for c in CASES]
    src = tmp_path / "ew.cpp"
    src.write_text(_harness(built))
    exe = tmp_path / "ew"
    # strict IEEE semantics, as NVRTC gives without --use_fast_math
    subprocess.run(["g++", "-O1", "-std=c++17", "-fno-fast-math", "-ffp-contract=off", str(src), "-o", str(exe)],
                   check=True, capture_output=True, text=True)
    res = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    blocks = res.split("#\n")[1:]
    assert len(blocks) == len(CASES)
    for case, (prog, arrays, want), block in zip(CASES, built, blocks):
        lines = block.split()
        if want.dtype.kind == "f":
            got = np.array([float.fromhex(v) if "nan" not in v and "inf" not in v else float(v) for v in lines])
        else:
            got = np.array([int(v) for v in lines])
        assert len(got) == len(want), case[0]
        try:
            _check(got, want, want.dtype)
        except AssertionError as e:
            raise AssertionError(f"{case[0]}: {e}") from None


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_generated_bodies_and_depthwise_kernel_compile_as_cuda(tmp_path):
    lines = ["#include <cuda_fp16.h>", "typedef __half float16;"]
    cases = [_build(c) for c in CASES]
    # float16 variants of the float32 chains: half loads and stores
    cases += [(p, [a.astype(np.float16) if a.dtype == np.float32 else a for a in arrays], w)
              for p, arrays, w in cases[:6]]
    for k, (prog, arrays, want) in enumerate(cases):
        body = prog.source([a.dtype for a in arrays])[2]
        out_dt = prog.dtypes([a.dtype for a in arrays])[prog.outputs[0]]
        params = [f"const {CTYPES[a.dtype][1]}* X{j}" for j, a in enumerate(arrays)] + [f"{CTYPES[out_dt][1]}* Y", "int n"]
        lines.append(f"extern \"C\" __global__ void k{k}({', '.join(params)}) {{")
        lines.append("  int i = blockIdx.x * blockDim.x + threadIdx.x; if (i >= n) return;")
        lines += [f"  const {CTYPES[a.dtype][1]} x{j} = X{j}[{'i' if a.ndim else '0'}];" for j, a in enumerate(arrays)]
        lines.append(f"  {CTYPES[out_dt][1]} y0;")
        lines += ["  " + ln for ln in body.splitlines()]
        lines.append("  Y[i] = y0;\n}")
    src = tmp_path / "ew.cu"
    src.write_text("\n".join(lines))
    dw = tmp_path / "dw.cu"
    dw.write_text(DEPTHWISE_SOURCE)
    rk = tmp_path / "raw.cu"
    rk.write_text(RAW_SOURCE)
    for f, extra in ((src, []), (dw, ["-DDW_T=float", "-DDW_ACC=float"]), (dw, ["-DDW_T=double", "-DDW_ACC=double"]),
                     (rk, ["-DONNXRT_REAL=float"]), (rk, ["-DONNXRT_REAL=double"]), (rk, ["-DONNXRT_HALF"])):
        r = subprocess.run(["nvcc", "--ptx", "-o", str(tmp_path / "out.ptx"), *extra, str(f)],
                           capture_output=True, text=True, check=False)
        assert r.returncode == 0, r.stderr[-3000:]
