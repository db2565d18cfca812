"""``ModelCompiler``: onnxruntime's compile API, as it applies to onnxrt.

onnxruntime's compile step asks compiling execution providers (QNN, OpenVINO...) to
turn the nodes they take into ``EPContext`` nodes holding precompiled binaries, and
writes the resulting model. onnxrt's providers compile their fused groups when a
session starts and keep nothing between processes, so there are no ``EPContext``
nodes to write: compiling writes the model as a CPU-provider session sees it after the
requested ``graph_optimization_level`` (``ORT_DISABLE_ALL`` by default, as in onnxruntime;
no device provider's fused kernels end up in a file another machine may load),
which is what onnxruntime writes for a model no provider compiles (the CPU provider's
case). ``OrtCompileApiFlags.ERROR_IF_NO_NODES_COMPILED`` therefore always fails, with
onnxruntime's message.

Initializers go where ``get_initializer_location_func(name, value, external_info)``
says (an :class:`OrtExternalInitializerInfo`, or ``None`` to keep them in the model),
or, with ``external_initializers_file_path``, those of at least
``external_initializers_size_threshold`` bytes go to that file.
"""

from __future__ import annotations

import copy
import enum
import os
import tempfile
from pathlib import Path
from typing import Callable

import onnx
from onnx import ModelProto, TensorProto

from .errors import Fail, InvalidArgument
from .options import GraphOptimizationLevel, SessionOptions

__all__ = ["ModelCompiler", "OrtCompileApiFlags", "OrtExternalInitializerInfo"]


class OrtCompileApiFlags(enum.IntFlag):
    """Flags for :class:`ModelCompiler`."""

    NONE = 0
    ERROR_IF_NO_NODES_COMPILED = 1
    ERROR_IF_OUTPUT_FILE_EXISTS = 2


class OrtExternalInitializerInfo:
    """Where an initializer's bytes are: ``filepath``, ``file_offset``, ``byte_size``."""

    def __init__(self, filepath: str | os.PathLike, file_offset: int, byte_size: int):
        self.filepath = os.fspath(filepath)
        self.file_offset = int(file_offset)
        self.byte_size = int(byte_size)

    def __repr__(self) -> str:
        return f"OrtExternalInitializerInfo({self.filepath!r}, offset={self.file_offset}, size={self.byte_size})"


InitializerLocationFunc = Callable[[str, object, "OrtExternalInitializerInfo | None"], "OrtExternalInitializerInfo | None"]


class ModelCompiler:
    """Compile a model (a path or bytes) with ``sess_options``; see the module docstring."""

    def __init__(
        self,
        sess_options: SessionOptions,
        input_model_path_or_bytes,
        embed_compiled_data_into_model: bool = False,
        external_initializers_file_path: str | os.PathLike | None = None,
        external_initializers_size_threshold: int = 1024,
        flags: int = OrtCompileApiFlags.NONE,
        graph_optimization_level: GraphOptimizationLevel = GraphOptimizationLevel.ORT_DISABLE_ALL,
        get_initializer_location_func: InitializerLocationFunc | None = None,
    ):
        if not isinstance(sess_options, SessionOptions):
            raise InvalidArgument(f"sess_options must be a SessionOptions, not {type(sess_options).__name__}")
        if external_initializers_file_path is not None and get_initializer_location_func is not None:
            raise InvalidArgument("give external_initializers_file_path or get_initializer_location_func, not both")
        if isinstance(input_model_path_or_bytes, (str, os.PathLike)):
            self._model = os.fspath(input_model_path_or_bytes)
        elif isinstance(input_model_path_or_bytes, (bytes, bytearray, memoryview)):
            self._model = bytes(input_model_path_or_bytes)
        else:
            raise InvalidArgument("the input model must be a path or bytes, "
                                  f"not {type(input_model_path_or_bytes).__name__}")
        self._so = sess_options
        self._embed = bool(embed_compiled_data_into_model)
        self._ext_path = os.fspath(external_initializers_file_path) if external_initializers_file_path else None
        self._threshold = int(external_initializers_size_threshold)
        self._flags = OrtCompileApiFlags(int(flags))
        self._level = GraphOptimizationLevel(int(graph_optimization_level))
        self._location_func = get_initializer_location_func

    # -- outputs -------------------------------------------------------------------------
    def compile_to_file(self, output_model_path: str | os.PathLike) -> None:
        """Write the compiled model to ``output_model_path``."""
        out = Path(os.fspath(output_model_path))
        if self._flags & OrtCompileApiFlags.ERROR_IF_OUTPUT_FILE_EXISTS and out.exists():
            raise Fail(f"the output model {str(out)!r} exists already")
        model = self._compiled()
        self._place_initializers(model, out.parent)
        onnx.save(model, str(out))

    def compile_to_bytes(self) -> bytes:
        """The compiled model, serialized."""
        model = self._compiled()
        self._place_initializers(model, Path.cwd())
        return model.SerializeToString()

    def compile_to_stream(self, write_func: Callable[[bytes], None]) -> None:
        """Hand the serialized compiled model to ``write_func`` (its exceptions become ``Fail``)."""
        data = self.compile_to_bytes()
        try:
            write_func(data)
        except Exception as e:  # noqa: BLE001 - onnxruntime reports the writer's error as a Fail
            raise Fail(f"the output stream's write function raised {type(e).__name__}: {e}") from e

    # -- the work ------------------------------------------------------------------------
    def _compiled(self) -> ModelProto:
        from .session import InferenceSession

        if self._flags & OrtCompileApiFlags.ERROR_IF_NO_NODES_COMPILED:
            # onnxrt's providers write no EPContext nodes: nothing is ever compiled ahead of time
            raise Fail("Unable to compile any nodes: onnxrt's execution providers compile when a session starts "
                       "and write no EPContext nodes")
        so = copy.copy(self._so)
        so._config = dict(self._so._config)
        so.graph_optimization_level = self._level
        so.enable_profiling = False
        with tempfile.TemporaryDirectory(prefix="onnxrt-compile-") as tmp:
            so.optimized_model_filepath = os.path.join(tmp, "compiled.onnx")
            so._config.pop("session.optimized_model_external_initializers_file_name", None)
            InferenceSession(self._model, so, providers=["CPUExecutionProvider"])
            model = onnx.load(so.optimized_model_filepath)
        return model

    def _original_locations(self) -> dict[str, OrtExternalInitializerInfo]:
        """The input model's externally stored initializers, as absolute file locations."""
        if not isinstance(self._model, str):
            return {}
        proto = onnx.load(self._model, load_external_data=False)
        base = Path(os.path.abspath(self._model)).parent
        out = {}
        for t in proto.graph.initializer:
            if t.data_location != TensorProto.EXTERNAL:
                continue
            kv = {e.key: e.value for e in t.external_data}
            if "location" in kv:
                out[t.name] = OrtExternalInitializerInfo(base / kv["location"], int(kv.get("offset", 0) or 0),
                                                         int(kv.get("length", 0) or 0))
        return out

    def _place_initializers(self, model: ModelProto, out_dir: Path) -> None:
        from onnx import numpy_helper

        from .ortvalue import OrtValue

        if self._location_func is None and self._ext_path is None:
            return
        original = self._original_locations() if self._location_func is not None else {}
        ext_file = None
        try:
            for t in model.graph.initializer:
                if self._location_func is not None:
                    value = OrtValue(numpy_helper.to_array(t))
                    info = self._location_func(t.name, value, original.get(t.name))
                    if info is None:
                        continue
                    if not isinstance(info, OrtExternalInitializerInfo):
                        raise InvalidArgument(f"get_initializer_location_func returned a {type(info).__name__} for "
                                              f"{t.name!r}; expected an OrtExternalInitializerInfo or None")
                    _set_external(t, _relative(info.filepath, out_dir), info.file_offset, info.byte_size)
                else:
                    raw = numpy_helper.to_array(t).tobytes()
                    if len(raw) < self._threshold:
                        continue
                    if ext_file is None:
                        ext_file = open(out_dir / self._ext_path, "wb")  # noqa: SIM115 - closed below
                    offset = ext_file.tell()
                    ext_file.write(raw)
                    _set_external(t, self._ext_path, offset, len(raw))
        finally:
            if ext_file is not None:
                ext_file.close()


def _relative(path: str, out_dir: Path) -> str:
    """``path`` relative to the compiled model's folder where it can be, as onnx locations are."""
    p = Path(os.path.abspath(path))
    try:
        return str(p.relative_to(out_dir.resolve() if out_dir.exists() else out_dir))
    except ValueError:
        return os.path.relpath(p, out_dir)


def _set_external(t: TensorProto, location: str, offset: int, length: int) -> None:
    t.ClearField("raw_data")
    for f in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data"):
        t.ClearField(f)
    del t.external_data[:]
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", str(offset)), ("length", str(length))):
        e = t.external_data.add()
        e.key, e.value = k, v
