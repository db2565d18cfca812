"""Packaging hook: the CPU provider's optional compiled kernels.

The C files of ``onnxrt_cpu/native/src/`` make one extension module,
``onnxrt_cpu.native._kernels``. It is optional: where no C compiler is found the
build goes on without it, and the provider runs its numpy kernels alone
(``onnxrt providers`` says whether the compiled kernels were loaded).
``onnxrt_cpu/native/ufunc/`` makes a second, ``onnxrt_cpu.native._ufuncs`` (numpy
ufuncs, such as a one-operand Relu), built against numpy's headers where they are
there, and as optional as the first.
"""

import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

SRC = Path("onnxrt_cpu") / "native" / "src"
UFUNC_SRC = Path("onnxrt_cpu") / "native" / "ufunc"


class BuildNative(build_ext):
    """``build_ext`` with optimizing flags for GCC and Clang."""

    def build_extensions(self):
        if self.compiler.compiler_type == "unix":
            for ext in self.extensions:
                # loops stay loops: most copies here are rows of a few dozen values, shorter
                # than a memcpy call costs
                ext.extra_compile_args += ["-O3", "-std=gnu11", "-pthread", "-fno-math-errno",
                                           "-fvisibility=hidden", "-fno-tree-loop-distribute-patterns"]
        super().build_extensions()


def _extensions() -> list[Extension]:
    here = Path(__file__).resolve().parent
    exts = [
        Extension("onnxrt_cpu.native._kernels", [str(SRC / c.name) for c in sorted((here / SRC).glob("*.c"))],
                  include_dirs=[str(SRC)], depends=[str(SRC / h.name) for h in sorted((here / SRC).glob("*.h"))],
                  extra_link_args=["-pthread"] if sys.platform != "win32" else [], optional=True)
    ]
    try:
        import numpy
    except ImportError:  # no headers to build the ufuncs against: np.maximum serves
        return exts
    exts.append(Extension("onnxrt_cpu.native._ufuncs", [str(UFUNC_SRC / "relu.c")],
                          include_dirs=[numpy.get_include()], optional=True))
    return exts


setup(ext_modules=_extensions(), cmdclass={"build_ext": BuildNative})
