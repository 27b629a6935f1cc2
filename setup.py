"""The one build step pyproject.toml cannot express: ``npu_compat.pth`` at the top of the wheel.

A ``.pth`` file runs at interpreter start only from a site directory itself, and
setuptools puts package data inside a package and ``data_files`` under the
installation prefix.  So ``build_py`` copies it to the root of the build directory,
from which the wheel is made (pip, uv and ``python -m build`` all go through it), and
names it among its outputs.  Everything else is configured in pyproject.toml.
"""

import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "npu_compat.pth"
HERE = os.path.dirname(os.path.abspath(__file__))


class BuildPyWithPth(build_py):
    def run(self) -> None:
        super().run()
        self.copy_file(os.path.join(HERE, PTH), os.path.join(self.build_lib, PTH), preserve_mode=False)

    def get_outputs(self, include_bytecode: bool = True) -> "list[str]":
        return [*super().get_outputs(include_bytecode), os.path.join(self.build_lib, PTH)]


setup(cmdclass={"build_py": BuildPyWithPth})
