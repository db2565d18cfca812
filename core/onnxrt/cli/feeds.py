"""Random inputs for a model, with its symbolic dimensions fixed by name."""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from ..dtypes import np_dtype
from ..errors import InvalidArgument

__all__ = ["resolve_shape", "random_input", "random_feeds"]


def resolve_shape(arg, dims: Mapping[str, int]) -> list[int]:
    """The concrete shape of input ``arg`` (a :class:`~onnxrt.NodeArg`), with each
    symbolic dimension taken from ``dims``; an unresolved one is an error naming it.

    A named dimension is fixed by its name (``--dim batch=1``). An unnamed one, which
    includes a negative declared ``dim_value`` (``NodeArg.shape`` reports it as
    ``None``, as onnxruntime does), is fixed by input and axis: ``--dim x:0=1``."""
    if arg.shape is None:
        raise InvalidArgument(f"input {arg.name!r} has no declared shape; give it as a file")
    shape = []
    for i, d in enumerate(arg.shape):
        if isinstance(d, int):
            shape.append(d)
        elif isinstance(d, str) and d in dims:
            shape.append(int(dims[d]))
        elif not d and f"{arg.name}:{i}" in dims:
            shape.append(int(dims[f"{arg.name}:{i}"]))
        elif isinstance(d, str) and d:
            raise InvalidArgument(
                f"input {arg.name!r} has an unresolved dimension {d!r}; fix it with --dim {d}=VALUE"
            )
        else:
            raise InvalidArgument(
                f"input {arg.name!r} has an unnamed free dimension {i} (shape {arg.shape}); "
                f"fix it with --dim {arg.name}:{i}=VALUE or give the input as a file"
            )
    return shape


def random_input(arg, dims: Mapping[str, int], rng: np.random.Generator) -> np.ndarray:
    """A random array for input ``arg``: standard normal floats, small non-negative
    integers (safe as indices), random booleans, placeholder strings."""
    tp = getattr(arg, "_tp", None)
    if tp is None or tp.WhichOneof("value") != "tensor_type" or not tp.tensor_type.elem_type:
        raise InvalidArgument(f"input {arg.name!r} has type {arg.type}; give it as a file")
    shape = resolve_shape(arg, dims)
    dt = np_dtype(tp.tensor_type.elem_type)
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
    ``given`` where present, random ones (seeded) for the rest."""
    rng = np.random.default_rng(seed)
    feeds = dict(given or {})
    for a in inputs:
        if a.name not in feeds:
            feeds[a.name] = random_input(a, dims or {}, rng)
    return feeds
