"""``onnxrt_cpu.kernels`` holds op families only: every module that ``load_all``
imports registers at least one kernel, and the helpers the families share (row
passes, branch-free selection, the convolution algorithms) live outside it."""

from __future__ import annotations

import importlib

import pytest

from onnxrt_cpu import kernels
from onnxrt_cpu.registry import REGISTRY


def _registering_modules() -> set[str]:
    kernels.load_all()
    return {d.cls.__module__ for defs in REGISTRY._defs.values() for d in defs}


@pytest.mark.parametrize("name", kernels.MODULES)
def test_every_kernel_module_registers_an_op(name):
    assert f"{kernels.__name__}.{name}" in _registering_modules()


@pytest.mark.parametrize("helper", ["onnxrt_cpu.rows", "onnxrt_cpu.select", "onnxrt_cpu.conv.forward"])
def test_shared_helpers_are_not_kernel_families(helper):
    module = importlib.import_module(helper)
    assert not module.__name__.startswith(kernels.__name__ + ".")
    assert module.__name__ not in _registering_modules()
