"""Loading a model: path, bytes or ``ModelProto``, with external data, checked.

Model files come from strangers, so external data is resolved here rather than by
``onnx.load``: every location must be a relative path that stays inside the model's
folder, with no ``..``, no absolute path, no symlinked folder on the way and no file
with several hard links; the data file itself may be a symlink only into the model's
folder or the folder of the file a symlinked model path points to (the Hugging Face
cache layout); offset and length are checked against the real file size and
the allocation limit. The known keys are onnx's: ``location``, ``offset``, ``length``,
``checksum`` and ``basepath``; ``basepath`` is accepted but never used, since locations
always resolve against the model's own folder, and ``checksum`` is not verified.
"""

from __future__ import annotations

import errno
import functools
import os
import stat
from pathlib import Path
from typing import Iterable

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import ModelProto, TensorProto

from ..errors import InvalidArgument, InvalidGraph, InvalidProtobuf, NoSuchFile, NotImplemented, OnnxRtError
from ..ir.order import topological_order
from ..run.limits import check_allocation, process_memory_limit

__all__ = ["load_model", "check_versions", "MAX_IR_VERSION", "MAX_OPSETS"]

#: The newest IR version this build understands (onnx's own).
MAX_IR_VERSION = onnx.IR_VERSION
#: The newest opset per domain this build understands.
MAX_OPSETS = {
    "": onnx.defs.onnx_opset_version(),
    "ai.onnx.ml": 5,
    "ai.onnx.preview.training": 1,
    "ai.onnx.preview": 1,
}
_EXTERNAL_KEYS = {"location", "offset", "length", "checksum", "basepath"}


def load_model(model, *, base_dir: str | os.PathLike | None = None,
               source: str | None = None, real_dir: str | os.PathLike | None = None,
               external_initializers: dict | None = None,
               external_files: dict[str, bytes] | None = None,
               split_off: Iterable[str] = ()) -> tuple[ModelProto, Path | None]:
    """Return ``(model_proto, model_dir)`` for a path, bytes or ``ModelProto``.

    External data is loaded into the tensors' ``raw_data``. ``model_dir`` is the folder
    external data is resolved against (``None`` for bytes without ``base_dir``);
    ``source`` names bytes in error messages. A model file reached through a symlink
    resolves its external data beside the path as given; ``real_dir`` (for bytes read from
    such a file) is the folder of the file the link points to. ``external_initializers``
    (name -> value) and ``external_files`` (location -> bytes) supply external data the
    caller holds in memory (``SessionOptions.add_external_initializers``...).
    ``split_off`` names the main-graph initializers already taken out of the bytes
    (:func:`~onnxrt.load.large_weights.split_large_weights`): they count as defined.
    """
    if isinstance(model, ModelProto):
        proto = model
        model_dir = Path(base_dir) if base_dir is not None else None
    elif isinstance(model, (bytes, bytearray, memoryview)):
        proto = _parse(bytes(model), source or "<bytes>")
        model_dir = Path(base_dir) if base_dir is not None else None
    elif isinstance(model, (str, os.PathLike)):
        path = Path(model)
        data = _read_model_file(path)
        proto = _parse(data, str(path))
        del data
        model_dir = Path(os.path.abspath(path)).parent
        real_dir = path.resolve().parent
    else:
        raise InvalidArgument(
            f"model must be a path, bytes or onnx.ModelProto, not {type(model).__name__}"
        )
    if not proto.HasField("graph"):
        raise InvalidGraph("the model has no graph")
    _check_text(proto, "model")
    _check_initializer_names(proto.graph, "main graph")
    _check_function_calls(proto)
    _check_required_inputs(proto, split_off)
    _sort_graph(proto.graph, 0)
    if external_initializers:
        _supply_initializers(proto, external_initializers)
    _load_external_data(proto, model_dir, Path(real_dir) if real_dir is not None else None, external_files or {})
    return proto, model_dir


def _supply_initializers(proto: ModelProto, values: dict) -> None:
    """Main-graph initializers named in ``values`` take those values (their external data is not read)."""
    from onnx import numpy_helper

    by_name = {t.name: t for t in proto.graph.initializer}
    for name, value in values.items():
        t = by_name.get(name)
        if t is None:
            raise InvalidArgument(f"add_external_initializers: the model has no initializer {name!r}")
        a = value.numpy() if hasattr(value, "numpy") else np.asarray(value)
        t.CopyFrom(numpy_helper.from_array(np.asarray(a), name))


@functools.lru_cache(maxsize=None)
def _required_positions(op_type: str, domain: str, opset: int) -> tuple[int, ...]:
    """The input positions an op's ONNX schema requires (neither optional nor variadic)."""
    try:
        schema = onnx.defs.get_schema(op_type, opset, domain)
    except Exception:  # noqa: BLE001 - no schema: nothing to check here
        return ()
    single = onnx.defs.OpSchema.FormalParameterOption.Single
    return tuple(i for i, p in enumerate(schema.inputs) if p.option == single)


def _check_required_inputs(proto: ModelProto, split_off: Iterable[str] = ()) -> None:
    """A node of a standard domain whose required input is given as an empty name is
    refused before shape inference sees it: onnx's inference dereferences the missing
    input's type (DictVectorizer with an empty input crashed the interpreter)."""
    from ..ir.graph import MAX_NESTING

    opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in proto.opset_import}
    opsets.setdefault("", 1)
    missing: list[str] = []
    # every name the model defines anywhere: a read of any other name has no type at
    # all, which is what onnx's inference does not survive (the exact scoping is
    # checked when the graph is built)
    defined: set[str] = set(split_off)  # initializers read straight from the file

    def collect(graph, depth):
        if depth > MAX_NESTING:
            return
        defined.update(vi.name for vi in graph.input)
        defined.update(t.name for t in graph.initializer)
        defined.update(st.values.name for st in graph.sparse_initializer)
        for n in graph.node:
            defined.update(n.output)
            if len(n.attribute):
                for a in n.attribute:
                    if a.HasField("g"):
                        collect(a.g, depth + 1)
                    for g in a.graphs:
                        collect(g, depth + 1)

    collect(proto.graph, 0)
    standard = ("", "ai.onnx.ml", "ai.onnx.preview.training")

    def walk(nodes, ops, depth, names):
        if depth > MAX_NESTING:
            raise InvalidGraph(f"subgraphs are nested more than {MAX_NESTING} levels deep")
        for n in nodes:
            if not missing:
                inputs = list(n.input)  # one copy: each access to the field builds a container
                for x in inputs:
                    if x and x not in names:
                        missing.append(f"node {n.name or n.op_type!r} ({n.op_type}) reads {x!r}, which is not defined")
                        break
                dom = n.domain
                dom = "" if dom == "ai.onnx" else dom
                if dom in standard and dom in ops:
                    for i in _required_positions(n.op_type, dom, ops[dom]):
                        if i >= len(inputs) or not inputs[i]:
                            missing.append(f"node {n.name or n.op_type!r} ({n.op_type}): its input {i} is "
                                           "required, but is missing or has an empty name")
                            break
            if len(n.attribute):
                for a in n.attribute:
                    if a.HasField("g"):
                        walk(a.g.node, ops, depth + 1, names)
                    for g in a.graphs:
                        walk(g.node, ops, depth + 1, names)

    # the whole walk first: a graph nested too deep is reported as that
    walk(proto.graph.node, opsets, 0, defined)
    for f in proto.functions:
        ops = dict(opsets)
        ops.update({("" if o.domain == "ai.onnx" else o.domain): o.version for o in f.opset_import})
        in_function = set(f.input)
        for n in f.node:
            in_function.update(n.output)
        walk(f.node, ops, 0, in_function | _subgraph_names(f.node))
    if missing:
        raise InvalidGraph(missing[0])


def _names_read(node, depth: int = 0) -> set[str]:
    """The names ``node``'s subgraphs read, at any depth (a superset of what they read
    from outside: names they define themselves are in it too, and are harmless)."""
    out: set[str] = set()
    if depth > 24:
        return out
    for a in node.attribute:
        for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
            for n in g.node:
                out.update(x for x in n.input if x)
                out |= _names_read(n, depth + 1)
            out.update(vi.name for vi in g.output)
    return out


def _sort_graph(graph, depth: int) -> None:
    """Put ``graph``'s nodes (and its subgraphs') in an order where each comes after the
    nodes it reads from, before shape inference walks them in the listed order: onnx's
    inference met an input with no type yet and crashed on some ops (DictVectorizer
    reading a value made later, or by itself). A cycle is InvalidGraph."""
    if depth > 24:
        return
    nodes = list(graph.node)
    with_graphs = set()
    for i, n in enumerate(nodes):
        if len(n.attribute):
            for a in n.attribute:
                if a.HasField("g"):
                    _sort_graph(a.g, depth + 1)
                    with_graphs.add(i)
                for g in a.graphs:
                    _sort_graph(g, depth + 1)
                    with_graphs.add(i)
    # a name that is also an input or initializer is defined twice: the graph's own
    # checks say so, this order is only for the names nodes make
    given = {vi.name for vi in graph.input} | {t.name for t in graph.initializer}
    producer: dict[str, int] = {}
    for i, n in enumerate(nodes):
        for o in n.output:
            if o and o not in given:
                producer.setdefault(o, i)
    # one pass that only looks: most graphs are in order already
    made: set[str] = set()
    ordered = True
    for i, n in enumerate(nodes):
        reads = _names_read(n) if i in with_graphs else ()
        for x in [*n.input, *reads]:
            if x in producer and x not in made:
                ordered = False
                break
        if not ordered:
            break
        made.update(n.output)
    if ordered:
        return
    deps: list[set[int]] = []
    for i, n in enumerate(nodes):
        reads = set(n.input)
        if i in with_graphs:
            reads |= _names_read(n)
        deps.append({producer[x] for x in reads if x in producer})
    order, stuck = topological_order(deps)
    if stuck:
        names = [nodes[i].name or nodes[i].op_type for i in stuck][:5]
        raise InvalidGraph(f"graph {graph.name!r} has a cycle through nodes {names}")
    sorted_nodes = [nodes[i] for i in order]
    del graph.node[:]
    graph.node.extend(sorted_nodes)


def _subgraph_names(nodes) -> set[str]:
    """The names the subgraphs of ``nodes`` define (inputs, initializers, outputs), at any depth."""
    out: set[str] = set()
    stack = [(a.g, 0) for n in nodes for a in n.attribute if a.HasField("g")]
    stack += [(g, 0) for n in nodes for a in n.attribute for g in a.graphs]
    while stack:
        g, depth = stack.pop()
        if depth > 24:
            continue
        out.update(vi.name for vi in g.input)
        out.update(t.name for t in g.initializer)
        for n in g.node:
            out.update(n.output)
            stack += [(a.g, depth + 1) for a in n.attribute if a.HasField("g")]
            stack += [(s, depth + 1) for a in n.attribute for s in a.graphs]
    return out


def _check_function_calls(proto: ModelProto) -> None:
    """Local functions that call themselves, or calls that would expand past
    :data:`onnxrt.ir.inline.MAX_INLINED_NODES` nodes, are refused here, before shape
    inference walks the calls (it expands them too: minutes for functions that each
    call the next twice, 24 deep)."""
    if not proto.functions:
        return
    from ..ir.inline import check_function_calls

    local = {(("" if f.domain == "ai.onnx" else f.domain), f.name): f for f in proto.functions}

    def calls(graph):
        for n in graph.node:
            key = ("" if n.domain == "ai.onnx" else n.domain, n.op_type)
            if key in local:
                yield key, n.name or n.op_type
            for a in n.attribute:
                if a.HasField("g"):
                    yield from calls(a.g)
                for g in a.graphs:
                    yield from calls(g)

    check_function_calls(local, calls(proto.graph))


def _check_initializer_names(graph, where: str) -> None:
    """No name given twice among a graph's initializers and sparse initializers (at any
    depth): the session splits large weights from small ones, so a duplicate would
    silently keep one of them."""
    seen: set[str] = set()
    for name in [t.name for t in graph.initializer] + [st.values.name for st in graph.sparse_initializer]:
        if name in seen:
            raise InvalidGraph(f"{where} {graph.name!r}: initializer {name!r} is defined twice")
        seen.add(name)
    for n in graph.node:
        for a in n.attribute:
            if a.HasField("g"):
                _check_initializer_names(a.g, f"subgraph {a.name!r} of node {n.name or n.op_type!r} in")
            for g in a.graphs:
                _check_initializer_names(g, f"subgraph {a.name!r} of node {n.name or n.op_type!r} in")


def _read_model_file(path: Path) -> bytes:
    """The bytes of the model file ``path``; every way the file system refuses is typed."""
    shown = str(path)[:200] + ("..." if len(str(path)) > 200 else "")
    try:
        st = os.stat(path)
    except ValueError:  # os refuses a NUL byte before asking the system
        raise InvalidArgument(f"model path {shown!r} contains a NUL byte") from None
    except FileNotFoundError:
        raise NoSuchFile(f"model file {shown!r} does not exist") from None
    except OSError as e:
        raise _path_error(e, f"model path {shown!r}", NoSuchFile) from None
    if not stat.S_ISREG(st.st_mode):
        raise InvalidArgument(f"model path {shown!r} is not a file")
    limit = process_memory_limit()
    if limit is not None and st.st_size > limit:
        # reading it whole could only end in a MemoryError or the kernel killing the process
        raise InvalidArgument(
            f"model file {shown!r} is {st.st_size} bytes, more than the {limit} bytes of memory "
            "this process may use"
        )
    try:
        with open(path, "rb") as f:
            return f.read()
    except MemoryError:
        raise InvalidArgument(
            f"model file {shown!r} ({st.st_size} bytes) does not fit in the memory this process may use"
        ) from None
    except OSError as e:
        raise _path_error(e, f"model file {shown!r}", NoSuchFile) from None


def _path_error(e: OSError, what: str, default: type) -> Exception:
    """An ``OSError`` from the file system as an onnxrt error naming ``what``."""
    if e.errno == errno.ENAMETOOLONG:
        # the caller's path is an argument; a model's external-data location is the model's
        kind = InvalidArgument if default is NoSuchFile else default
        return kind(f"{what} is too long for the file system ({e.strerror})")
    if e.errno == errno.ENOTDIR:
        return default(f"{what} goes through something that is not a folder")
    if e.errno in (errno.ENOENT,):
        return NoSuchFile(f"{what} does not exist")
    return default(f"cannot read {what}: {e.strerror or e}")


def _parse(data: bytes, where: str) -> ModelProto:
    if not data:
        raise InvalidProtobuf(f"{where}: the model is empty (0 bytes)")
    proto = ModelProto()
    try:
        proto.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError, RecursionError) as e:
        raise InvalidProtobuf(f"{where}: not a valid ONNX model protobuf ({e})") from None
    if not proto.HasField("graph") and proto.ir_version == 0:
        raise InvalidProtobuf(f"{where}: not an ONNX model (no ir_version and no graph)")
    return proto


def check_versions(proto: ModelProto) -> dict[str, int]:
    """Check the IR version and opset imports; return ``{domain: version}``."""
    if proto.ir_version <= 0:
        raise InvalidGraph("the model has no ir_version")
    if proto.ir_version > MAX_IR_VERSION:
        raise NotImplemented(
            f"model IR version {proto.ir_version} is newer than the newest supported ({MAX_IR_VERSION})"
        )
    opsets: dict[str, int] = {}
    for imp in proto.opset_import:
        dom = "" if imp.domain in ("", "ai.onnx") else imp.domain
        opsets[dom] = int(imp.version)
    if not proto.opset_import:
        # IR version 1 and 2 models may omit it; they mean ai.onnx opset 1
        opsets[""] = 1
    ai = opsets.get("")
    if ai is not None and ai > MAX_OPSETS[""]:
        raise NotImplemented(
            f"model uses ai.onnx opset {ai}; the newest supported is {MAX_OPSETS['']}"
        )
    ml = opsets.get("ai.onnx.ml")
    if ml is not None and ml > MAX_OPSETS["ai.onnx.ml"]:
        raise NotImplemented(
            f"model uses ai.onnx.ml opset {ml}; the newest supported is {MAX_OPSETS['ai.onnx.ml']}"
        )
    return opsets


def _repeated(field) -> bool:
    # newer protobuf releases drop ``label`` in favour of ``is_repeated``
    if hasattr(field, "is_repeated"):
        return field.is_repeated
    return field.label == field.LABEL_REPEATED


def _check_text(msg, where: str) -> None:
    """Every string field must be text: protobuf hands invalid UTF-8 back as bytes."""
    for field, value in msg.ListFields():
        if field.type == field.TYPE_STRING:
            values = value if _repeated(field) else (value,)
            for v in values:
                if not isinstance(v, str):
                    raise InvalidProtobuf(f"{where}.{field.name} is not valid UTF-8: {bytes(v)[:40]!r}")
        elif field.type == field.TYPE_MESSAGE:
            if _repeated(field):
                for i, v in enumerate(value):
                    _check_text(v, f"{where}.{field.name}[{i}]")
            else:
                _check_text(value, f"{where}.{field.name}")


# -- external data ------------------------------------------------------------------


def _iter_tensors(graph):
    for t in graph.initializer:
        yield t
    for s in graph.sparse_initializer:
        yield s.values
        yield s.indices
    for n in graph.node:
        for a in n.attribute:
            if a.HasField("t"):
                yield a.t
            yield from a.tensors
            if a.HasField("g"):
                yield from _iter_tensors(a.g)
            for g in a.graphs:
                yield from _iter_tensors(g)


def _all_tensors(proto: ModelProto):
    yield from _iter_tensors(proto.graph)
    for f in proto.functions:
        for n in f.node:
            for a in n.attribute:
                if a.HasField("t"):
                    yield a.t
                if a.HasField("g"):
                    yield from _iter_tensors(a.g)


def _load_external_data(proto: ModelProto, model_dir: Path | None, real_dir: Path | None = None,
                        files: dict[str, bytes] | None = None) -> None:
    for t in _all_tensors(proto):
        if t.data_location != TensorProto.EXTERNAL:
            continue
        info = {}
        for kv in t.external_data:
            if kv.key not in _EXTERNAL_KEYS:
                raise InvalidGraph(
                    f"tensor {t.name!r}: unknown external_data key {kv.key!r} "
                    f"(known: {', '.join(sorted(_EXTERNAL_KEYS))})"
                )
            info[kv.key] = kv.value
        if files and info.get("location") in files:
            _from_memory(t, info, files[info["location"]])
            continue
        if model_dir is None:
            raise InvalidArgument(
                f"tensor {t.name!r} uses external data, but the model was given as bytes "
                "or a ModelProto without a folder to resolve it against"
            )
        location = info.get("location")
        if not location:
            raise InvalidGraph(f"tensor {t.name!r}: external data has no location")
        path = _safe_external_path(model_dir, location, t.name, real_dir)
        try:
            offset = int(info.get("offset", 0) or 0)
            length = int(info["length"]) if info.get("length") else None
        except ValueError:
            raise InvalidGraph(f"tensor {t.name!r}: external data offset/length is not an integer") from None
        try:
            size = path.stat().st_size
        except OSError as e:
            raise _path_error(e, f"external data {location[:200]!r} of tensor {t.name!r}", InvalidGraph) from None
        if offset < 0 or offset > size:
            raise InvalidGraph(
                f"tensor {t.name!r}: external data offset {offset} is outside {location!r} ({size} bytes)"
            )
        if length is None:
            length = size - offset
        if length < 0 or offset + length > size:
            raise InvalidGraph(
                f"tensor {t.name!r}: external data [{offset}, {offset + length}) runs past the end "
                f"of {location!r} ({size} bytes)"
            )
        try:
            check_allocation([length], np.uint8, f"external data of tensor {t.name!r}")
        except InvalidArgument as e:
            raise InvalidGraph(str(e)) from None
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                t.raw_data = f.read(length)
        except OSError as e:
            raise _path_error(e, f"external data {location[:200]!r} of tensor {t.name!r}", InvalidGraph) from None
        t.data_location = TensorProto.DEFAULT
        del t.external_data[:]


def _from_memory(t: TensorProto, info: dict, data: bytes) -> None:
    """Fill ``t`` from an in-memory external-data file, with the same offset/length checks."""
    try:
        offset = int(info.get("offset", 0) or 0)
        length = int(info["length"]) if info.get("length") else len(data) - offset
    except ValueError:
        raise InvalidGraph(f"tensor {t.name!r}: external data offset/length is not an integer") from None
    if offset < 0 or length < 0 or offset + length > len(data):
        raise InvalidGraph(f"tensor {t.name!r}: external data [{offset}, {offset + length}) runs past the end "
                           f"of the in-memory file {info['location']!r} ({len(data)} bytes)")
    t.raw_data = data[offset:offset + length]
    t.data_location = TensorProto.DEFAULT
    del t.external_data[:]


def _safe_external_path(model_dir: Path, location: str, tensor: str, real_dir: Path | None = None) -> Path:
    shown = location[:200] + ("..." if len(location) > 200 else "")
    if "\0" in location:
        raise InvalidGraph(f"tensor {tensor!r}: external data location {shown!r} contains a NUL byte")
    try:
        return _walk_external_path(model_dir, location, tensor, real_dir)
    except OnnxRtError:
        raise  # NoSuchFile is an OSError too
    except OSError as e:
        # too long a name (ENAMETOOLONG), a file on the way (w.bin/x: ENOTDIR), ...
        raise _path_error(e, f"tensor {tensor!r}: external data location {shown!r}", InvalidGraph) from None


def _walk_external_path(model_dir: Path, location: str, tensor: str, real_dir: Path | None = None) -> Path:
    loc = Path(location)
    if loc.is_absolute() or location.startswith(("/", "\\")) or (len(location) > 1 and location[1] == ":"):
        raise InvalidGraph(f"tensor {tensor!r}: external data location {location!r} is absolute")
    if ".." in loc.parts or ".." in location.replace("\\", "/").split("/"):
        raise InvalidGraph(f"tensor {tensor!r}: external data location {location!r} leaves the model folder")
    base = Path(model_dir)
    # walk each component so that a symlinked folder on the way is refused too
    cur = base
    for i, part in enumerate(loc.parts):
        cur = cur / part
        try:
            st = os.lstat(cur)
        except FileNotFoundError:
            raise NoSuchFile(f"tensor {tensor!r}: external data file {location!r} does not exist") from None
        if stat.S_ISLNK(st.st_mode):
            if i < len(loc.parts) - 1:
                raise InvalidGraph(f"tensor {tensor!r}: external data path {location!r} goes through a symlink")
            return _linked_data_file(cur, base, real_dir, location, tensor)
    st = os.lstat(cur)
    if not stat.S_ISREG(st.st_mode):
        raise InvalidGraph(f"tensor {tensor!r}: external data {location!r} is not a regular file")
    if st.st_nlink > 1:
        raise InvalidGraph(f"tensor {tensor!r}: external data file {location!r} has several hard links")
    resolved = cur.resolve()
    if base.resolve() not in resolved.parents:
        raise InvalidGraph(f"tensor {tensor!r}: external data location {location!r} leaves the model folder")
    return resolved


def _linked_data_file(link: Path, base: Path, real_dir: Path | None, location: str, tensor: str) -> Path:
    """The target of an external-data file that is a symlink (a Hugging Face cache's
    snapshot entry): allowed only when it resolves to a regular file with one hard link
    inside the model's folder or inside the folder of the file the model path points to."""
    try:
        target = link.resolve(strict=True)
    except (OSError, RuntimeError):
        raise NoSuchFile(f"tensor {tensor!r}: external data file {location!r} is a symlink to nothing") from None
    allowed = [base.resolve()] + ([real_dir.resolve()] if real_dir is not None else [])
    if not any(d in target.parents for d in allowed):
        raise InvalidGraph(
            f"tensor {tensor!r}: External data path validation failed: {location!r} is a symlink to a file "
            "outside the model's folder and outside the folder of the model file it links to"
        )
    st = os.stat(target)
    if not stat.S_ISREG(st.st_mode):
        raise InvalidGraph(f"tensor {tensor!r}: external data {location!r} is not a regular file")
    if st.st_nlink > 1:
        raise InvalidGraph(f"tensor {tensor!r}: external data file {location!r} has several hard links")
    return target
