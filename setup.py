"""The one build step pyproject.toml cannot express: ``npu_compat.pth`` at the top of the wheel.

A ``.pth`` file runs at interpreter start only from a site directory itself, and
setuptools puts package data inside a package and ``data_files`` under the
installation prefix.  So ``build_py`` copies it to the root of the build directory,
from which the wheel is made (pip, uv and ``python -m build`` all go through it), and
names it among its outputs.  Everything else is configured in pyproject.toml.
"""

import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

PTH = "npu_compat.pth"
HERE = os.path.dirname(os.path.abspath(__file__))


class BuildPyWithPth(build_py):
    def run(self) -> None:
        super().run()
        self.copy_file(os.path.join(HERE, PTH), os.path.join(self.build_lib, PTH), preserve_mode=False)

    def get_outputs(self, include_bytecode: bool = True) -> "list[str]":
        return [*super().get_outputs(include_bytecode), os.path.join(self.build_lib, PTH)]


class EditableWheelWithPth(editable_wheel):
    """``pip install -e``: the editable wheel gets the same ``npu_compat.pth``.

    setuptools' editable wheel is built from its own strategy (a finder or a static ``.pth``)
    plus whatever sits in its unpacked directory, not from ``build_py``'s outputs.  The
    unpacked directory is where setuptools also writes namespace ``.pth`` files; ours goes
    beside them.  It sorts after setuptools' ``__editable__.*.pth``, so the finder that maps
    ``_npu_compat_precheck`` to the source tree is installed before our line imports it.  If a
    setuptools release renames the hook, editable installs lose only this file (and
    ``doctor`` says auto-activation is not effective).
    """

    def _install_namespaces(self, installation_dir: str, pth_prefix: str) -> None:
        super()._install_namespaces(installation_dir, pth_prefix)
        shutil.copyfile(os.path.join(HERE, PTH), os.path.join(installation_dir, PTH))


setup(cmdclass={"build_py": BuildPyWithPth, "editable_wheel": EditableWheelWithPth})
