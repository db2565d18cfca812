"""Random inputs for a model, with its symbolic dimensions fixed by name, or by input
and axis for an unnamed one."""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from ..dtypes import np_dtype
from ..errors import InvalidArgument
from ..run.feeds import _ANONYMOUS_DIMS

__all__ = ["UnresolvedDimensions", "ANONYMOUS_DIMS", "resolve_shape", "random_input", "random_feeds"]

#: dim_params that mean "unknown", not a name shared between axes (paddle2onnx writes
#: ``'?'``), the set the feed check binds no name for: like an unnamed dimension, each
#: is fixed by input and axis (``--dim x:2=48``)
ANONYMOUS_DIMS = _ANONYMOUS_DIMS


class UnresolvedDimensions(InvalidArgument):
    """Inputs that cannot be made up: each dimension no ``--dim`` fixes, and each input
    with no declared shape or not a tensor, all in one message.

    :ivar problems: ``(input name, axis, dimension name)`` for each unresolved dimension
        (the name is ``None`` for an unnamed one), ``(input name, None, why)`` for an
        input that must come from a file.
    """

    def __init__(self, problems: list[tuple[str, int | None, str | None]], shapes: Mapping[str, list | None]):
        self.problems = list(problems)
        super().__init__(_describe(self.problems, shapes))


def _is_unnamed(d) -> bool:
    return d is None or d == "" or d in ANONYMOUS_DIMS


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _describe(problems, shapes) -> str:
    """One line: what each input lacks, then every option that fixes it."""
    order = list(dict.fromkeys(p[0] for p in problems))
    clauses, dim_opts, files = [], [], []
    for name in order:
        mine = [p for p in problems if p[0] == name]
        whole = [why for _, axis, why in mine if axis is None]
        if whole:
            clauses.append(f"input {name!r} {whole[0]}")
            files.append(name)
            continue
        named = list(dict.fromkeys(d for _, _, d in mine if d is not None))
        unnamed = [axis for _, axis, d in mine if d is None]
        parts = []
        if named:
            quoted = [repr(d) for d in named]
            parts.append(f"an unresolved dimension {quoted[0]}" if len(named) == 1
                         else f"unresolved dimensions {_and(quoted)}")
            dim_opts += [f"--dim {d}=VALUE" for d in named if f"--dim {d}=VALUE" not in dim_opts]
        if unnamed:
            axes = [str(a) for a in unnamed]
            parts.append((f"an unnamed free dimension {axes[0]}" if len(axes) == 1
                          else f"unnamed free dimensions {_and(axes)}") + f" (shape {shapes.get(name)})")
            dim_opts += [f"--dim {name}:{a}=VALUE" for a in unnamed]
            files.append(name)
        clauses.append(f"input {name!r} has " + " and ".join(parts))
    fix = []
    if dim_opts:
        fix.append(f"fix {'them' if len(dim_opts) > 1 else 'it'} with {' '.join(dim_opts)}")
    if files:
        what = "the input as a file" if len(files) == 1 else "the inputs as files"
        fix.append(f"{'or ' if dim_opts else ''}give {what}: {' '.join(f'--input {n}=FILE.npy' for n in files)}")
    return "; ".join(clauses) + "; " + " ".join(fix)


def _unresolved(arg, dims: Mapping[str, int]) -> tuple[list[int], list[tuple[str, int | None, str | None]]]:
    """The shape of ``arg`` with ``dims`` applied, and what stays unresolved."""
    if arg.shape is None:
        return [], [(arg.name, None, "has no declared shape")]
    shape, problems = [], []
    for i, d in enumerate(arg.shape):
        axis_key = f"{arg.name}:{i}"
        if isinstance(d, int):
            shape.append(d)
        elif _is_unnamed(d) and axis_key in dims:
            shape.append(int(dims[axis_key]))  # by input and axis: the most specific
        elif isinstance(d, str) and d in dims:
            shape.append(int(dims[d]))
        else:
            shape.append(-1)
            problems.append((arg.name, i, None if _is_unnamed(d) else d))
    return shape, problems


def resolve_shape(arg, dims: Mapping[str, int]) -> list[int]:
    """The concrete shape of input ``arg`` (a :class:`~onnxrt.NodeArg`), with each
    symbolic dimension taken from ``dims``.

    A named dimension is fixed by its name (``--dim batch=1``). An unnamed one, which
    includes a negative declared ``dim_value`` (``NodeArg.shape`` reports it as
    ``None``, as onnxruntime does) and the anonymous ``'?'``, is fixed by input and
    axis: ``--dim x:0=1``.

    :raises UnresolvedDimensions: naming every dimension of ``arg`` left unresolved."""
    shape, problems = _unresolved(arg, dims)
    if problems:
        raise UnresolvedDimensions(problems, {arg.name: arg.shape})
    return shape


def _generatable(arg) -> str | None:
    """Why no random value can be made for ``arg`` (not a tensor of a known type), or ``None``."""
    tp = getattr(arg, "_tp", None)
    if tp is None or tp.WhichOneof("value") != "tensor_type" or not tp.tensor_type.elem_type:
        return f"has type {arg.type}"
    return None


def random_input(arg, dims: Mapping[str, int], rng: np.random.Generator) -> np.ndarray:
    """A random array for input ``arg``: standard normal floats, small non-negative
    integers (safe as indices), random booleans, placeholder strings."""
    why = _generatable(arg)
    if why:
        raise UnresolvedDimensions([(arg.name, None, why)], {arg.name: arg.shape})
    shape = resolve_shape(arg, dims)
    dt = np_dtype(arg._tp.tensor_type.elem_type)
    if dt.kind == "O":
        return np.array(["text"] * int(np.prod(shape)), dtype=object).reshape(shape)
    if dt == np.bool_:
        return rng.integers(0, 2, size=shape).astype(bool)
    if dt.kind in "iu":
        return rng.integers(0, 10, size=shape).astype(dt)
    return rng.standard_normal(shape).astype(dt)


def random_feeds(inputs: Sequence, dims: Mapping[str, int] | None = None, seed: int = 0,
                 given: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """A feed for every input in ``inputs`` (``session.get_inputs()``): the arrays in
    ``given`` where present, random ones (seeded) for the rest.

    :raises UnresolvedDimensions: naming, at once, every dimension of every input
        left unresolved (and every input that must be given)."""
    rng = np.random.default_rng(seed)
    feeds = dict(given or {})
    problems = []
    for a in inputs:
        if a.name not in feeds:
            why = _generatable(a)
            problems += [(a.name, None, why)] if why else _unresolved(a, dims or {})[1]
    if problems:
        raise UnresolvedDimensions(problems, {a.name: a.shape for a in inputs})
    for a in inputs:
        if a.name not in feeds:
            feeds[a.name] = random_input(a, dims or {}, rng)
    return feeds
