"""Packaging hook: ship ``plugins-template/`` inside the wheel.

``onnxrt new-provider`` renders the template; from a source checkout it reads
``plugins-template/`` directly, and an installed wheel carries a copy beside the
renderer (``onnxrt/cli/scaffold.py``), as ``onnxrt/cli/provider_template``, so the
command works without the source tree.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyWithTemplate(build_py):
    """The usual build_py, plus a copy of the provider template into the package."""

    def run(self):
        super().run()
        src = Path(__file__).resolve().parent / "plugins-template"
        if src.is_dir():
            dst = Path(self.build_lib) / "onnxrt" / "cli" / "provider_template"
            shutil.copytree(src, dst, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


setup(cmdclass={"build_py": BuildPyWithTemplate})
