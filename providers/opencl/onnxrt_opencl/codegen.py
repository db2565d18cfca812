"""OpenCL C generation for elementwise chains: one work item per element, values in registers.

:class:`ElementwiseProgram` takes a chain of elementwise nodes (one node, or a fused
group) and, per call, works out every value's dtype and broadcast shape, coalesces the
dimensions of the iteration space, and launches one generated kernel. The source is
canonical: it depends only on the ops, the dtypes, the coalesced rank and each
operand's access mode, never on sizes or attribute values (those are kernel
arguments), so PoCL or a GPU driver compiles each distinct chain once per process.

Access modes of an operand against the iteration space: ``c`` (same shape: index by
the work-item id), ``s`` (one element: index 0) and ``b`` (broadcast on some
dimensions: index by coordinates and per-dimension strides). An output smaller than
the iteration space (an intermediate that is also a group output) is written only by
the work items at coordinate 0 of its broadcast dimensions.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from onnxrt.errors import InvalidArgument

from .cltypes import ctype

__all__ = ["EwNode", "ElementwiseProgram", "OpSpec", "OPS", "coalesce"]

F = frozenset(np.dtype(t) for t in (np.float32, np.float64))
SIGNED = frozenset(np.dtype(t) for t in (np.int8, np.int16, np.int32, np.int64))
UNSIGNED = frozenset(np.dtype(t) for t in (np.uint8, np.uint16, np.uint32, np.uint64))
INTS = SIGNED | UNSIGNED
NUM = F | INTS
BOOL = frozenset([np.dtype(np.bool_)])
ALL = NUM | BOOL


class Params:
    """Collects the scalar kernel arguments (attribute values) of one generated kernel."""

    def __init__(self) -> None:
        self.decls: list[str] = []
        self.values: list[Any] = []

    def add(self, value, dtype) -> str:
        dt = np.dtype(dtype)
        name = f"p{len(self.values)}"
        self.decls.append(f"{ctype(dt)} {name}")
        self.values.append(dt.type(value))
        return name


@dataclass
class OpSpec:
    """How one elementwise op computes and which dtypes it takes.

    :ivar expr: ``fn(args, dtypes, out_dtype, attrs, params) -> C expression``.
    :ivar types: the dtypes each input may have (the last entry repeats).
    :ivar out: the output dtype from the input dtypes and attributes.
    :ivar accepts: an extra refusal check on the node's attributes.
    """

    expr: Callable
    types: tuple
    out: Callable = lambda dts, attrs: dts[0]
    accepts: Callable | None = None
    arity: tuple[int, int] = (1, 1)


def _t(dt) -> str:
    return ctype(dt)


def _is_f(dt) -> bool:
    return np.dtype(dt).kind == "f"


def _unary_f(fmt: str) -> OpSpec:
    return OpSpec(lambda a, d, o, at, p: fmt.format(*a, T=_t(o)), (F,))


def _num_binary(op: str, types=NUM) -> OpSpec:
    return OpSpec(lambda a, d, o, at, p: f"(({_t(o)})({a[0]} {op} {a[1]}))", (types, types), arity=(2, 2))


def _cmp(op: str) -> OpSpec:
    return OpSpec(lambda a, d, o, at, p: f"((uchar)({a[0]} {op} {a[1]}))", (ALL, ALL),
                  out=lambda dts, at: np.dtype(np.bool_), arity=(2, 2))


def _logic(fmt: str, n: int) -> OpSpec:
    return OpSpec(lambda a, d, o, at, p: fmt.format(*a), (BOOL,) * n,
                  out=lambda dts, at: np.dtype(np.bool_), arity=(n, n))


def _f_attr(at, name, default):
    return float(at.get(name, default))


def _relu(a, d, o, at, p):
    return f"({a[0]} < ({_t(o)})0 ? ({_t(o)})0 : {a[0]})"


def _abs(a, d, o, at, p):
    if _is_f(o):
        return f"fabs({a[0]})"
    if o in UNSIGNED:
        return a[0]
    return f"(({_t(o)})abs({a[0]}))"


def _neg(a, d, o, at, p):
    return f"(({_t(o)})(-{a[0]}))"


def _sign(a, d, o, at, p):
    if _is_f(o):
        return f"(isnan({a[0]}) ? {a[0]} : sign({a[0]}))"
    return f"(({_t(o)})(({a[0]} > 0) - ({a[0]} < 0)))"


def _fold(fn: Callable[[str, str, Any], str]):
    def expr(a, d, o, at, p):
        acc = a[0]
        for x in a[1:]:
            acc = fn(acc, x, o)
        return acc

    return expr


def _min2(x, y, o):
    return f"((isnan({x}) || {x} < {y}) ? {x} : {y})" if _is_f(o) else f"min({x}, {y})"


def _max2(x, y, o):
    return f"((isnan({x}) || {x} > {y}) ? {x} : {y})" if _is_f(o) else f"max({x}, {y})"


def _mean(a, d, o, at, p):
    s = " + ".join(a)
    return f"(({s}) / ({_t(o)}){len(a)})"


def _leaky(a, d, o, at, p):
    al = p.add(_f_attr(at, "alpha", 0.01), o)
    return f"({a[0]} < ({_t(o)})0 ? {al} * {a[0]} : {a[0]})"


def _elu(a, d, o, at, p):
    al = p.add(_f_attr(at, "alpha", 1.0), o)
    return f"({a[0]} < ({_t(o)})0 ? {al} * (exp({a[0]}) - ({_t(o)})1) : {a[0]})"


def _selu(a, d, o, at, p):
    al = p.add(_f_attr(at, "alpha", 1.67326319217681884765625), o)
    g = p.add(_f_attr(at, "gamma", 1.05070102214813232421875), o)
    return f"({a[0]} > ({_t(o)})0 ? {g} * {a[0]} : {g} * ({al} * exp({a[0]}) - {al}))"


def _celu(a, d, o, at, p):
    al = p.add(_f_attr(at, "alpha", 1.0), o)
    T = _t(o)
    return f"(fmax(({T})0, {a[0]}) + fmin(({T})0, {al} * (exp({a[0]} / {al}) - ({T})1)))"


def _hardsigmoid(a, d, o, at, p):
    al = p.add(_f_attr(at, "alpha", 0.2), o)
    be = p.add(_f_attr(at, "beta", 0.5), o)
    T = _t(o)
    return f"fmax(({T})0, fmin(({T})1, {al} * {a[0]} + {be}))"


def _hardswish(a, d, o, at, p):
    T = _t(o)
    return f"({a[0]} * fmax(({T})0, fmin(({T})1, ({T})(1.0 / 6.0) * {a[0]} + ({T})0.5)))"


def _thresholded(a, d, o, at, p):
    al = p.add(_f_attr(at, "alpha", 1.0), o)
    return f"({a[0]} > {al} ? {a[0]} : ({_t(o)})0)"


def _shrink(a, d, o, at, p):
    b = p.add(_f_attr(at, "bias", 0.0), o)
    lam = p.add(_f_attr(at, "lambd", 0.5), o)
    T = _t(o)
    return f"({a[0]} < -{lam} ? {a[0]} + {b} : ({a[0]} > {lam} ? {a[0]} - {b} : ({T})0))"


def _gelu(a, d, o, at, p):
    T = _t(o)
    x = a[0]
    if at.get("approximate", "none") == "tanh":
        return (f"(({T})0.5 * {x} * (({T})1 + tanh(({T})0.7978845608028654 * "
                f"({x} + ({T})0.044715 * {x} * {x} * {x}))))")
    return f"(({T})0.5 * {x} * (({T})1 + erf({x} * ({T})0.7071067811865476)))"


def _softplus(a, d, o, at, p):
    x = a[0]
    return f"({x} > ({_t(o)})0 ? {x} + log1p(exp(-{x})) : log1p(exp({x})))"


def _clip(a, d, o, at, p):
    # a[0] is x; bounds are inputs (opset >= 11, absent ones are None) or attributes
    x = a[0]
    lo = a[1] if len(a) > 1 else None
    hi = a[2] if len(a) > 2 else None
    if "min" in at:
        lo = p.add(at["min"], o)
    if "max" in at:
        hi = p.add(at["max"], o)
    if np.dtype(o).kind == "f":
        # an omitted bound is the type's lowest or largest finite value (the spec's
        # numeric_limits), so infinities are clamped to it, as on the CPU provider
        if lo is None:
            lo = p.add(np.finfo(o).min, o)
        if hi is None:
            hi = p.add(np.finfo(o).max, o)
    e = x
    if lo is not None:
        e = f"({e} < {lo} ? {lo} : {e})"
    if hi is not None:
        e = f"({e} > {hi} ? {hi} : {e})"
    return e


def _cast_to(dts, at):
    from onnxrt.dtypes import np_dtype

    return np.dtype(np_dtype(int(at["to"])))


def _cast(a, d, o, at, p):
    if o == np.bool_:
        return f"((uchar)({a[0]} != 0))"
    return f"(({_t(o)}){a[0]})"


def _cast_accepts(at) -> str | None:
    try:
        dt = _cast_to([], at)
    except Exception:  # noqa: BLE001
        return "Cast to a type OpenCL has no kernels for"
    if dt not in ALL:
        return f"Cast to {dt} runs on the CPU"
    return None


def _pow(a, d, o, at, p):
    return f"pow({a[0]}, ({_t(o)}){a[1]})"


def _mod(a, d, o, at, p):
    x, y = a
    if int(at.get("fmod", 0)) or _is_f(o):
        return f"fmod({x}, {y})" if _is_f(o) else f"(({_t(o)})({x} % {y}))"
    if o in UNSIGNED:
        return f"({x} % {y})"
    r = f"({x} % {y})"
    return f"(({_t(o)})(({r} != 0 && (({r} < 0) != ({y} < 0))) ? {r} + {y} : {r}))"


def _isinf(a, d, o, at, p):
    neg = int(at.get("detect_negative", 1))
    pos = int(at.get("detect_positive", 1))
    x = a[0]
    conds = []
    if pos:
        conds.append(f"{x} > 0")
    if neg:
        conds.append(f"{x} < 0")
    if not conds:
        return "((uchar)0)"
    return f"((uchar)(isinf({x}) && ({' || '.join(conds)})))"


def _bool_out(dts, at):
    return np.dtype(np.bool_)


OPS: dict[str, OpSpec] = {
    # activations and unary math (float)
    "Relu": OpSpec(_relu, (F | SIGNED,)),
    "Abs": OpSpec(_abs, (NUM,)),
    "Neg": OpSpec(_neg, (F | SIGNED,)),
    "Sign": OpSpec(_sign, (NUM,)),
    "Exp": _unary_f("exp({0})"),
    "Log": _unary_f("log({0})"),
    "Sqrt": _unary_f("sqrt({0})"),
    "Reciprocal": _unary_f("(({T})1 / {0})"),
    "Floor": _unary_f("floor({0})"),
    "Ceil": _unary_f("ceil({0})"),
    "Round": _unary_f("rint({0})"),
    "Erf": _unary_f("erf({0})"),
    "Sin": _unary_f("sin({0})"),
    "Cos": _unary_f("cos({0})"),
    "Tan": _unary_f("tan({0})"),
    "Asin": _unary_f("asin({0})"),
    "Acos": _unary_f("acos({0})"),
    "Atan": _unary_f("atan({0})"),
    "Sinh": _unary_f("sinh({0})"),
    "Cosh": _unary_f("cosh({0})"),
    "Tanh": _unary_f("tanh({0})"),
    "Asinh": _unary_f("asinh({0})"),
    "Acosh": _unary_f("acosh({0})"),
    "Atanh": _unary_f("atanh({0})"),
    "Sigmoid": _unary_f("(({T})1 / (({T})1 + exp(-{0})))"),
    "Softsign": _unary_f("({0} / (({T})1 + fabs({0})))"),
    "Softplus": OpSpec(_softplus, (F,)),
    "Mish": _unary_f("({0} * tanh(log1p(exp({0}))))"),
    "LeakyRelu": OpSpec(_leaky, (F,)),
    "Elu": OpSpec(_elu, (F,)),
    "Selu": OpSpec(_selu, (F,)),
    "Celu": OpSpec(_celu, (F,)),
    "HardSigmoid": OpSpec(_hardsigmoid, (F,)),
    "HardSwish": OpSpec(_hardswish, (F,)),
    "ThresholdedRelu": OpSpec(_thresholded, (F,)),
    "Shrink": OpSpec(_shrink, (F,)),
    "Gelu": OpSpec(_gelu, (F,)),
    "IsNaN": OpSpec(lambda a, d, o, at, p: f"((uchar)isnan({a[0]}))", (F,), out=_bool_out),
    "IsInf": OpSpec(_isinf, (F,), out=_bool_out),
    # binary and variadic arithmetic (numpy broadcasting)
    "Add": _num_binary("+"),
    "Sub": _num_binary("-"),
    "Mul": _num_binary("*"),
    "Div": _num_binary("/"),
    "Pow": OpSpec(_pow, (F, F | frozenset([np.dtype(np.int32), np.dtype(np.int64)])), arity=(2, 2)),
    "Mod": OpSpec(_mod, (NUM, NUM), arity=(2, 2)),
    "PRelu": OpSpec(lambda a, d, o, at, p: f"({a[0]} < ({_t(o)})0 ? {a[1]} * {a[0]} : {a[0]})", (F, F),
                    arity=(2, 2)),
    "Min": OpSpec(_fold(_min2), (NUM,), arity=(1, 16)),
    "Max": OpSpec(_fold(_max2), (NUM,), arity=(1, 16)),
    "Sum": OpSpec(_fold(lambda x, y, o: f"({x} + {y})"), (F,), arity=(1, 16)),
    "Mean": OpSpec(_mean, (F,), arity=(1, 16)),
    "BitwiseAnd": _num_binary("&", INTS),
    "BitwiseOr": _num_binary("|", INTS),
    "BitwiseXor": _num_binary("^", INTS),
    "BitwiseNot": OpSpec(lambda a, d, o, at, p: f"(({_t(o)})~{a[0]})", (INTS,)),
    # comparisons and logic (bool is stored as uchar 0/1)
    "Equal": _cmp("=="),
    "Less": _cmp("<"),
    "Greater": _cmp(">"),
    "LessOrEqual": _cmp("<="),
    "GreaterOrEqual": _cmp(">="),
    "Not": _logic("((uchar)!{0})", 1),
    "And": _logic("((uchar)({0} && {1}))", 2),
    "Or": _logic("((uchar)({0} || {1}))", 2),
    "Xor": _logic("((uchar)(({0} != 0) != ({1} != 0)))", 2),
    # selection, clipping and conversion
    "Where": OpSpec(lambda a, d, o, at, p: f"({a[0]} ? {a[1]} : {a[2]})", (BOOL, ALL, ALL),
                    out=lambda dts, at: dts[1], arity=(3, 3)),
    "Clip": OpSpec(_clip, (NUM,), arity=(1, 3)),
    "Cast": OpSpec(_cast, (ALL,), out=_cast_to, accepts=_cast_accepts),
    "CastLike": OpSpec(lambda a, d, o, at, p: _cast(a, d, o, at, p), (ALL, ALL),
                       out=lambda dts, at: dts[1], arity=(2, 2)),
}

#: ops whose inputs broadcast together (all of them except Cast/CastLike's type input)
_TYPE_ONLY_INPUT = {"CastLike": 1}


@dataclass
class EwNode:
    """One elementwise node of a chain: names only (values are resolved per call)."""

    op: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict = field(default_factory=dict)
    name: str = ""


def coalesce(shape: tuple, operands: list[tuple]) -> tuple[list[int], list[list[int]], list[str]]:
    """Merge the dimensions of an iteration space that every operand treats alike.

    :param shape: the iteration shape.
    :param operands: each operand's shape (broadcastable to ``shape``).
    :returns: ``(dims, strides, modes)``: the coalesced sizes, each operand's element
        strides over them (0 on broadcast dimensions) and its access mode.
    """
    rank = len(shape)
    padded = [(1,) * (rank - len(s)) + tuple(s) for s in operands]
    keep = [d for d in range(rank) if shape[d] != 1]
    dims: list[int] = []
    flags: list[tuple[bool, ...]] = []
    for d in keep:
        f = tuple(p[d] != 1 for p in padded)
        if dims and flags[-1] == f:
            dims[-1] *= shape[d]
        else:
            dims.append(shape[d])
            flags.append(f)
    strides: list[list[int]] = []
    modes: list[str] = []
    for k in range(len(operands)):
        st = [0] * len(dims)
        acc = 1
        for j in range(len(dims) - 1, -1, -1):
            if flags[j][k]:
                st[j] = acc
                acc *= dims[j]
        real = [flags[j][k] for j in range(len(dims))]
        modes.append("c" if all(real) else ("s" if not any(real) else "b"))
        strides.append(st)
    return dims, strides, modes


class ElementwiseProgram:
    """Runs a chain of elementwise nodes as one generated OpenCL kernel.

    :param nodes: the chain in topological order.
    :param inputs: the external input names, in the order :meth:`run` receives them.
    :param outputs: the values to return, in order.
    :param rt: the :class:`~onnxrt_opencl.runtime.CLRuntime`.
    """

    def __init__(self, nodes: list[EwNode], inputs: list[str], outputs: list[str], rt):
        self.nodes = nodes
        self.inputs = inputs
        self.outputs = outputs
        self.rt = rt
        self._cache: dict[tuple, tuple[Any, list]] = {}
        self._lock = threading.Lock()
        self._split: list | None = None
        # inputs only read for their type (CastLike's second) are not passed to the kernel
        read = {i for n in self.nodes for k, i in enumerate(n.inputs) if i and k != _TYPE_ONLY_INPUT.get(n.op)}
        self._read = [k for k, name in enumerate(inputs) if name in read]
        self._read_names = [inputs[k] for k in self._read]

    def _infer(self, in_dtypes, in_shapes):
        dts = dict(zip(self.inputs, in_dtypes))
        shapes = dict(zip(self.inputs, in_shapes))
        for n in self.nodes:
            spec = OPS[n.op]
            idts = [dts[i] if i else None for i in n.inputs]
            out_dt = np.dtype(spec.out(idts, n.attrs))
            skip = _TYPE_ONLY_INPUT.get(n.op)
            ish = [shapes[i] for k, i in enumerate(n.inputs) if i and k != skip]
            try:
                shp = tuple(np.broadcast_shapes(*ish))
            except ValueError:
                raise InvalidArgument(
                    f"{n.op} node {n.name!r}: input shapes {', '.join(str(s) for s in ish)} do not broadcast"
                ) from None
            for o in n.outputs:
                if o:
                    dts[o] = out_dt
                    shapes[o] = shp
        return dts, shapes

    def _source(self, dts, modes_in, modes_out, rank) -> tuple[str, list]:
        params = Params()
        var: dict[str, str] = {}
        body: list[str] = []
        args: list[str] = []
        need_fp64 = any(dts[n] == np.float64 for n in dts)
        for k, name in enumerate(self._read_names):
            T = _t(dts[name])
            args.append(f"__global const {T} *in{k}")
            idx = {"c": "gid", "s": "0", "b": " + ".join(f"c{j} * si{k}_{j}" for j in range(rank)) or "0"}[modes_in[k]]
            var[name] = f"v{len(var)}"
            body.append(f"    const {T} {var[name]} = in{k}[{idx}];")
        for k, name in enumerate(self.outputs):
            args.append(f"__global {_t(dts[name])} *out{k}")
        for n in self.nodes:
            spec = OPS[n.op]
            a = [var.get(i) if i else None for i in n.inputs]  # type-only inputs have no variable
            if n.op == "Clip":
                a = (a + [None, None])[:3]  # x, min, max with absent bounds as None
            else:
                a = [x for x in a if x is not None]
            expr = spec.expr(a, [dts[i] for i in n.inputs if i], dts[n.outputs[0]], n.attrs, params)
            o = n.outputs[0]
            var[o] = f"v{len(var)}"
            body.append(f"    const {_t(dts[o])} {var[o]} = {expr};")
        for k, name in enumerate(self.outputs):
            m = modes_out[k]
            if m == "c":
                body.append(f"    out{k}[gid] = {var[name]};")
            elif m == "s":
                body.append(f"    if (gid == 0) out{k}[0] = {var[name]};")
            else:
                off = " + ".join(f"c{j} * so{k}_{j}" for j in range(rank))
                guard = " && ".join(f"(so{k}_{j} != 0 || c{j} == 0)" for j in range(rank))
                body.append(f"    if ({guard}) out{k}[{off}] = {var[name]};")
        args += params.decls
        strided = [k for k, m in enumerate(modes_in) if m == "b"]
        strided_out = [k for k, m in enumerate(modes_out) if m == "b"]
        coords: list[str] = []
        if strided or strided_out:
            args += [f"long d{j}" for j in range(rank)]
            args += [f"long si{k}_{j}" for k in strided for j in range(rank)]
            args += [f"long so{k}_{j}" for k in strided_out for j in range(rank)]
            coords.append("    long r = gid;")
            for j in range(rank - 1, 0, -1):
                coords.append(f"    const long c{j} = r % d{j}; r /= d{j};")
            coords.append("    const long c0 = r;")
        head = "#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n" if need_fp64 else ""
        src = (f"{head}__kernel void ew({', '.join(args)})\n{{\n    const long gid = get_global_id(0);\n"
               + "\n".join(coords + body) + "\n}\n")
        return src, params.values

    def _run_node_by_node(self, arrays) -> tuple:
        if self._split is None:
            progs = []
            for n in self.nodes:
                names = list(dict.fromkeys(i for i in n.inputs if i))
                progs.append(ElementwiseProgram([n], names, [n.outputs[0]], self.rt))
            self._split = progs
        env = dict(zip(self.inputs, arrays))
        for prog in self._split:
            (env[prog.outputs[0]],) = prog.run(*[env[i] for i in prog.inputs])
        return tuple(env[o] for o in self.outputs)

    def run(self, *arrays) -> tuple:
        """Compute the outputs for device arrays ``arrays`` (one per external input)."""
        rt = self.rt
        arrays_all = arrays
        in_dtypes = [np.dtype(a.dtype) for a in arrays]
        in_shapes = [tuple(a.shape) for a in arrays]
        dts, shapes = self._infer(in_dtypes, in_shapes)
        out_shapes = [shapes[o] for o in self.outputs]
        arrays = [arrays[k] for k in self._read]
        in_shapes = [in_shapes[k] for k in self._read]
        in_dtypes = [in_dtypes[k] for k in self._read]
        try:
            it = tuple(np.broadcast_shapes(*in_shapes, *[shapes[n.outputs[0]] for n in self.nodes]))
        except ValueError:
            # parts of the group iterate over shapes that do not broadcast together
            return self._run_node_by_node(arrays_all)
        outs = [rt.empty(s, dts[o]) for s, o in zip(out_shapes, self.outputs)]
        total = int(np.prod(it, dtype=np.int64))
        if total == 0:
            return tuple(outs)
        dims, strides, modes = coalesce(it, in_shapes + out_shapes)
        n_in = len(arrays)
        modes_in, modes_out = modes[:n_in], modes[n_in:]
        # every input's dtype counts: a type-only input sets an output type
        key = (tuple(np.dtype(a.dtype) for a in arrays_all), tuple(modes), len(dims))
        entry = self._cache.get(key)
        if entry is None:
            src, values = self._source(dts, modes_in, modes_out, len(dims))
            entry = (rt.program(src), values)
            with self._lock:
                self._cache[key] = entry
        prg, values = entry
        scal: list[Any] = list(values)
        if any(m == "b" for m in modes):
            scal += [np.int64(d) for d in dims]
            scal += [np.int64(s) for k in range(n_in) if modes_in[k] == "b" for s in strides[k]]
            scal += [np.int64(s) for k in range(len(outs)) if modes_out[k] == "b" for s in strides[n_in + k]]
        rt.launch(prg, "ew", (total,), None, *arrays, *outs, *scal)
        return tuple(outs)
