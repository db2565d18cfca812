"""CUDA C for elementwise chains: the body of one ``cupy.ElementwiseKernel`` per group.

A chain is a list of :class:`EwNode` (one node, or a fused group) over named values.
:class:`EwProgram` works out each value's dtype from the group's input dtypes, then
writes one statement per node into the kernel body, keeping intermediates in
registers. CuPy's ``ElementwiseKernel`` does the broadcasting and indexing, so the
body only names the per-element values.

float16 values are read into ``float`` and rounded to half once, when stored, so a
float16 model runs in float16 memory with float32 arithmetic in registers.

Every op has two definitions in :data:`OPS`: the CUDA C expression and the same
formula over an array namespace (``xp``). The second runs a group node by node when
one kernel cannot (an intermediate output with a smaller shape than the group's
iteration space) and is what the tests compare the generated code against.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["CTYPES", "OPS", "EwNode", "EwProgram", "fusable", "literal"]

F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)
BOOL = np.dtype(np.bool_)
FLOATS = frozenset([F16, F32, F64])
INTS = frozenset(np.dtype(t) for t in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64))
NUMS = FLOATS | INTS

#: numpy dtype -> (CuPy's parameter type name, the C type of that parameter in the body)
CTYPES: dict[np.dtype, tuple[str, str]] = {
    F16: ("float16", "float16"),
    F32: ("float32", "float"),
    F64: ("float64", "double"),
    BOOL: ("bool", "bool"),
    np.dtype(np.int8): ("int8", "signed char"),
    np.dtype(np.int16): ("int16", "short"),
    np.dtype(np.int32): ("int32", "int"),
    np.dtype(np.int64): ("int64", "long long"),
    np.dtype(np.uint8): ("uint8", "unsigned char"),
    np.dtype(np.uint16): ("uint16", "unsigned short"),
    np.dtype(np.uint32): ("uint32", "unsigned int"),
    np.dtype(np.uint64): ("uint64", "unsigned long long"),
}


def compute_ctype(dt: np.dtype) -> str:
    """The C type a value of ``dt`` is held in inside the kernel (half widens to float)."""
    return "float" if dt == F16 else CTYPES[dt][1]


def literal(value: float, ctype: str) -> str:
    """A C literal of ``value`` as ``ctype`` (inf and nan spelled portably)."""
    v = float(value)
    # NAN and INFINITY need math.h, which NVRTC does not include
    if math.isnan(v):
        return f"(({ctype})(0.0 / 0.0))"
    if math.isinf(v):
        return f"(({ctype})({'-' if v < 0 else ''}1.0 / 0.0))"
    return f"(({ctype}){v!r})"


@dataclass
class OpSpec:
    """One elementwise op.

    :ivar c: ``fn(args, ctype, attrs) -> C expression``; ``args`` are C expressions
        already in the compute type ``ctype`` of the inputs.
    :ivar xp: ``fn(xp, arrays, attrs) -> array``, the same formula on whole arrays.
    :ivar types: the dtypes the inputs may have.
    :ivar out: ``fn(in_dtypes, attrs) -> out dtype``.
    :ivar arity: (min, max) inputs.
    """

    c: Callable
    xp: Callable
    types: frozenset = FLOATS
    out: Callable = lambda dts, at: dts[0]
    arity: tuple[int, int] = (1, 1)
    accepts: Callable | None = None


def _lit(v, t):
    return literal(v, t)


def _clamp01(e: str, t: str) -> str:
    # comparisons, not fmin/fmax, so that NaN passes through as numpy.clip lets it
    # (the repeated subexpression is pure; the compiler evaluates it once)
    return f"(({e}) < ({t})0 ? ({t})0 : (({e}) > ({t})1 ? ({t})1 : ({e})))"


def _relu(xp, a, at):
    return xp.where(a[0] < 0, a[0].dtype.type(0), a[0])


def _sigmoid_xp(xp, a, at):
    return 1 / (1 + xp.exp(-a[0]))


def _maxmin(cmp: str):
    # NaN propagates, as numpy.maximum/minimum and onnxruntime do
    def c(a, t, at):
        e = a[0]
        for b in a[1:]:
            e = f"(({e}) {cmp} ({b}) || ({e}) != ({e}) ? ({e}) : ({b}))"
        return e

    return c


def _max_xp(xp, a, at):
    y = a[0]
    for b in a[1:]:
        y = xp.maximum(y, b)
    return y


def _min_xp(xp, a, at):
    y = a[0]
    for b in a[1:]:
        y = xp.minimum(y, b)
    return y


def _gelu_c(a, t, at):
    x = a[0]
    if at.get("approximate", "none") == "tanh":
        return (f"({_lit(0.5, t)} * {x} * ({_lit(1, t)} + tanh({_lit(math.sqrt(2 / math.pi), t)} * "
                f"({x} + {_lit(0.044715, t)} * {x} * {x} * {x}))))")
    return f"({_lit(0.5, t)} * {x} * ({_lit(1, t)} + erf({x} * {_lit(1 / math.sqrt(2), t)})))"


def _erf_xp(xp):
    if xp is np:
        from math import erf

        return np.vectorize(erf, otypes=[np.float64])
    import cupyx.scipy.special as sp  # pragma: no cover - needs a GPU

    return sp.erf


def _gelu_xp(xp, a, at):
    x = a[0]
    if at.get("approximate", "none") == "tanh":
        return 0.5 * x * (1 + xp.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    return (0.5 * x * (1 + _erf_xp(xp)(x / math.sqrt(2)))).astype(x.dtype)


#: the finite limit an omitted Clip bound stands for, per C type computed in (the
#: spec's numeric_limits::lowest() and max(); half widens to float and keeps its
#: infinities)
_CLIP_LIMITS = {"float": float(np.finfo(np.float32).max), "double": float(np.finfo(np.float64).max)}


def _clip_c(a, t, at):
    e = a[0]
    lo = a[1] if len(a) > 1 else None
    hi = a[2] if len(a) > 2 else None
    limit = _CLIP_LIMITS.get(t)
    if limit is not None:
        lo = literal(-limit, t) if lo is None else lo
        hi = literal(limit, t) if hi is None else hi
    if lo is not None:
        e = f"(({e}) < ({lo}) ? ({lo}) : ({e}))"
    if hi is not None:
        e = f"(({e}) > ({hi}) ? ({hi}) : ({e}))"
    return e


def _clip_xp(xp, a, at):
    y = a[0]
    lo = a[1] if len(a) > 1 else None
    hi = a[2] if len(a) > 2 else None
    if y.dtype in (np.float32, np.float64):
        info = np.finfo(y.dtype)
        lo = y.dtype.type(info.min) if lo is None else lo
        hi = y.dtype.type(info.max) if hi is None else hi
    if lo is not None:
        y = xp.where(y < lo, lo, y)
    if hi is not None:
        y = xp.where(y > hi, hi, y)
    return y


def _cast_out(dts, at):
    from onnx import helper

    return np.dtype(helper.tensor_dtype_to_np_dtype(int(at["to"])))


def _cast_accepts(at) -> str | None:
    try:
        dt = _cast_out([], at)
    except Exception:  # noqa: BLE001
        return "Cast to a type the fused kernel cannot hold"
    return None if dt in CTYPES else f"Cast to {dt} is not fused"


def _cast_c(a, t, at):
    dt = _cast_out([], at)
    if dt == BOOL:
        return f"(({a[0]}) != 0)"
    return f"(({compute_ctype(dt)})({a[0]}))"


def _cmp(op: str, ufunc: str) -> OpSpec:
    return OpSpec(lambda a, t, at: f"(({a[0]}) {op} ({a[1]}))",
                  lambda xp, a, at: getattr(xp, ufunc)(a[0], a[1]),
                  NUMS, out=lambda dts, at: BOOL, arity=(2, 2))


def _arith(op: str, ufunc: str, types=NUMS) -> OpSpec:
    return OpSpec(lambda a, t, at: f"(({t})(({a[0]}) {op} ({a[1]})))",
                  lambda xp, a, at: getattr(xp, ufunc)(a[0], a[1]), types, arity=(2, 2))


def _unary(cfn: str, ufunc: str) -> OpSpec:
    return OpSpec(lambda a, t, at: f"{cfn}({a[0]})", lambda xp, a, at: getattr(xp, ufunc)(a[0]))


def _f(at, name, default):
    return float(at.get(name, default))


OPS: dict[str, OpSpec] = {
    "Identity": OpSpec(lambda a, t, at: a[0], lambda xp, a, at: a[0].copy(), NUMS | {BOOL}),
    "Add": _arith("+", "add"),
    "Sub": _arith("-", "subtract"),
    "Mul": _arith("*", "multiply"),
    # integer division by zero traps in C; only floats are fused
    "Div": _arith("/", "divide", FLOATS),
    "Pow": OpSpec(lambda a, t, at: f"(({t})pow({a[0]}, ({t})({a[1]})))",
                  lambda xp, a, at: xp.power(a[0], a[1].astype(a[0].dtype)), FLOATS, arity=(2, 2)),
    "Max": OpSpec(_maxmin(">"), _max_xp, FLOATS, arity=(1, 8)),
    "Min": OpSpec(_maxmin("<"), _min_xp, FLOATS, arity=(1, 8)),
    "Neg": OpSpec(lambda a, t, at: f"(-({a[0]}))", lambda xp, a, at: -a[0], FLOATS | {np.dtype(np.int32), np.dtype(np.int64)}),
    "Abs": _unary("fabs", "abs"),
    "Exp": _unary("exp", "exp"),
    "Log": _unary("log", "log"),
    "Sqrt": _unary("sqrt", "sqrt"),
    "Floor": _unary("floor", "floor"),
    "Ceil": _unary("ceil", "ceil"),
    # rint rounds half to even under the default rounding mode, as ONNX Round asks
    "Round": _unary("rint", "rint"),
    "Sin": _unary("sin", "sin"),
    "Cos": _unary("cos", "cos"),
    "Tan": _unary("tan", "tan"),
    "Tanh": _unary("tanh", "tanh"),
    "Erf": OpSpec(lambda a, t, at: f"erf({a[0]})", lambda xp, a, at: _erf_xp(xp)(a[0]).astype(a[0].dtype)),
    "Reciprocal": OpSpec(lambda a, t, at: f"({_lit(1, t)} / ({a[0]}))", lambda xp, a, at: 1 / a[0]),
    "Relu": OpSpec(lambda a, t, at: f"(({a[0]}) < ({t})0 ? ({t})0 : ({a[0]}))", _relu),
    "LeakyRelu": OpSpec(
        lambda a, t, at: f"(({a[0]}) < ({t})0 ? ({a[0]}) * {_lit(_f(at, 'alpha', 0.01), t)} : ({a[0]}))",
        lambda xp, a, at: xp.where(a[0] < 0, a[0] * a[0].dtype.type(_f(at, "alpha", 0.01)), a[0])),
    "Elu": OpSpec(
        lambda a, t, at: f"(({a[0]}) < ({t})0 ? {_lit(_f(at, 'alpha', 1.0), t)} * expm1({a[0]}) : ({a[0]}))",
        lambda xp, a, at: xp.where(a[0] < 0, a[0].dtype.type(_f(at, "alpha", 1.0)) * xp.expm1(a[0]), a[0])),
    "Sigmoid": OpSpec(lambda a, t, at: f"({_lit(1, t)} / ({_lit(1, t)} + exp(-({a[0]}))))", _sigmoid_xp),
    "HardSigmoid": OpSpec(
        lambda a, t, at: _clamp01(f"{_lit(_f(at, 'alpha', 0.2), t)} * ({a[0]}) + {_lit(_f(at, 'beta', 0.5), t)}", t),
        lambda xp, a, at: xp.clip(a[0] * a[0].dtype.type(_f(at, "alpha", 0.2)) + a[0].dtype.type(_f(at, "beta", 0.5)), 0, 1)),
    "HardSwish": OpSpec(
        lambda a, t, at: f"(({a[0]}) * {_clamp01(f'({a[0]}) / {_lit(6, t)} + {_lit(0.5, t)}', t)})",
        lambda xp, a, at: a[0] * xp.clip(a[0] / 6 + a[0].dtype.type(0.5), 0, 1)),
    "Softplus": OpSpec(lambda a, t, at: f"(fmax(({a[0]}), ({t})0) + log1p(exp(-fabs({a[0]}))))",
                       lambda xp, a, at: xp.maximum(a[0], 0) + xp.log1p(xp.exp(-xp.abs(a[0])))),
    "Softsign": OpSpec(lambda a, t, at: f"(({a[0]}) / ({_lit(1, t)} + fabs({a[0]})))",
                       lambda xp, a, at: a[0] / (1 + xp.abs(a[0]))),
    "Gelu": OpSpec(_gelu_c, _gelu_xp),
    "Clip": OpSpec(_clip_c, _clip_xp, arity=(1, 3),
                   accepts=lambda at: "Clip with min/max attributes (opset < 11) is not fused" if "min" in at or "max" in at else None),
    "Where": OpSpec(lambda a, t, at: f"(({a[0]}) ? ({a[1]}) : ({a[2]}))",
                    lambda xp, a, at: xp.where(a[0], a[1], a[2]), frozenset([BOOL]) | NUMS,
                    out=lambda dts, at: dts[1], arity=(3, 3)),
    "Equal": _cmp("==", "equal"),
    "Less": _cmp("<", "less"),
    "Greater": _cmp(">", "greater"),
    "LessOrEqual": _cmp("<=", "less_equal"),
    "GreaterOrEqual": _cmp(">=", "greater_equal"),
    "Not": OpSpec(lambda a, t, at: f"(!({a[0]}))", lambda xp, a, at: xp.logical_not(a[0]), frozenset([BOOL])),
    "And": OpSpec(lambda a, t, at: f"(({a[0]}) && ({a[1]}))", lambda xp, a, at: xp.logical_and(a[0], a[1]),
                  frozenset([BOOL]), arity=(2, 2)),
    "Or": OpSpec(lambda a, t, at: f"(({a[0]}) || ({a[1]}))", lambda xp, a, at: xp.logical_or(a[0], a[1]),
                 frozenset([BOOL]), arity=(2, 2)),
    "Cast": OpSpec(_cast_c, lambda xp, a, at: a[0].astype(_cast_out([], at)), NUMS | {BOOL}, out=_cast_out,
                   accepts=_cast_accepts),
}


def fusable(op_type: str, domain: str, in_dtypes: list, attrs: dict) -> str | None:
    """``None`` when the node can be part of a generated elementwise kernel, else why not."""
    if domain not in ("", "ai.onnx"):
        return f"{domain}.{op_type} is not an elementwise op"
    spec = OPS.get(op_type)
    if spec is None:
        return f"{op_type} is not an elementwise op"
    present = [d for d in in_dtypes if d is not None]
    if not spec.arity[0] <= len(in_dtypes) <= spec.arity[1]:
        return f"{op_type} with {len(in_dtypes)} inputs is not fused"
    if op_type == "Where":
        if in_dtypes[0] != BOOL or any(d not in NUMS for d in in_dtypes[1:]):
            return f"Where over {in_dtypes} is not fused"
    elif op_type == "Cast":
        if in_dtypes[0] not in CTYPES:
            return f"Cast from {in_dtypes[0]} is not fused"
    elif len(present) != len(in_dtypes) or any(d not in spec.types for d in present):
        return f"{op_type} over {[str(d) for d in in_dtypes]} is not fused"
    elif op_type not in ("Pow",) and len(set(present)) > 1:
        return f"{op_type} with mixed input types is not fused"
    if spec.accepts is not None:
        why = spec.accepts(attrs)
        if why:
            return why
    return None


@dataclass
class EwNode:
    """One elementwise node of a chain: op, input and output value names, attributes."""

    op_type: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)
    name: str = ""


class EwProgram:
    """A chain of elementwise nodes as one kernel body (per input-dtype signature).

    :param chain: the nodes in topological order.
    :param inputs: the external input names, in the order ``run`` receives them.
    :param outputs: the value names the kernel writes, in the order it returns them.
    """

    def __init__(self, chain: list[EwNode], inputs: list[str], outputs: list[str]):
        self.chain = list(chain)
        self.inputs = list(inputs)
        self.outputs = list(outputs)

    # -- types ---------------------------------------------------------------------------
    def dtypes(self, in_dtypes: list) -> dict[str, np.dtype]:
        """Every value's dtype given the external inputs' dtypes."""
        dts = {n: np.dtype(d) for n, d in zip(self.inputs, in_dtypes)}
        for node in self.chain:
            args = [dts[i] for i in node.inputs if i]
            dts[node.outputs[0]] = np.dtype(OPS[node.op_type].out(args, node.attrs))
        return dts

    # -- source ----------------------------------------------------------------------------
    def source(self, in_dtypes: list) -> tuple[str, str, str, str]:
        """``(in_params, out_params, body, name)`` for ``cupy.ElementwiseKernel``."""
        dts = self.dtypes(in_dtypes)
        var: dict[str, str] = {}
        lines = []
        in_params = []
        for k, n in enumerate(self.inputs):
            dt = dts[n]
            in_params.append(f"{CTYPES[dt][0]} x{k}")
            # half values widen once, on load
            var[n] = f"((float)x{k})" if dt == F16 else f"x{k}"
        for j, node in enumerate(self.chain):
            spec = OPS[node.op_type]
            args_dt = [dts[i] for i in node.inputs if i]
            # arithmetic runs in the widest compute type of the inputs (Where: of the values)
            t = compute_ctype(args_dt[1] if node.op_type == "Where" else args_dt[0])
            args = [var[i] if i else None for i in node.inputs]
            out = node.outputs[0]
            ot = compute_ctype(dts[out])
            lines.append(f"const {ot} v{j} = ({ot})({spec.c(args, t, node.attrs)});  // {node.op_type}")
            var[out] = f"v{j}"
        out_params = []
        for k, n in enumerate(self.outputs):
            dt = dts[n]
            out_params.append(f"{CTYPES[dt][0]} y{k}")
            lines.append(f"y{k} = ({CTYPES[dt][1]})({var[n]});")
        body = "\n".join(lines)
        import hashlib  # here: loading the plugin (every session does) should not load OpenSSL, 3 MiB

        digest = hashlib.sha1(("|".join(in_params + out_params) + body).encode()).hexdigest()[:12]
        name = "onnxrt_ew_" + "_".join(n.op_type.lower() for n in self.chain[:4]) + "_" + digest
        return ", ".join(in_params), ", ".join(out_params), body, name

    # -- evaluation with an array namespace --------------------------------------------------
    def evaluate(self, xp, arrays: list) -> list:
        """Run the chain node by node with ``xp`` (numpy or cupy) and return the outputs."""
        vals = dict(zip(self.inputs, arrays))
        for node in self.chain:
            spec = OPS[node.op_type]
            args = [vals[i] if i else None for i in node.inputs]
            dt = np.dtype(spec.out([a.dtype for a in args if a is not None], node.attrs))
            with np.errstate(all="ignore"):
                src = [a.astype(F32) if a is not None and a.dtype == F16 else a for a in args]
                y = spec.xp(xp, src, node.attrs)
            vals[node.outputs[0]] = xp.asarray(y).astype(dt, copy=False)
        return [vals[n] for n in self.outputs]

    def shapes(self, in_shapes: list) -> dict[str, tuple]:
        """Every value's broadcast shape given the inputs' shapes."""
        shp = {n: tuple(s) for n, s in zip(self.inputs, in_shapes)}
        for node in self.chain:
            shp[node.outputs[0]] = tuple(np.broadcast_shapes(*[shp[i] for i in node.inputs if i]))
        return shp
