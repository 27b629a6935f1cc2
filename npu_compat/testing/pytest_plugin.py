"""pytest fixtures for a simulated Ascend host.  Enable with ``-p npu_compat.testing.pytest_plugin``.

* ``ascend_env`` -- the environment of a simulated Ascend host (for subprocesses).
* ``npu_ray_cluster`` -- one real local Ray cluster per test session advertising only
  ``{"NPU": 2}`` (no GPU); skipped with a reason when Ray is not installed.  While it lives,
  this process's environment carries the cluster's authentication setting
  (``RayCluster.auth_env``), so ``ray.init(address=cluster.address)`` here and in every child
  that inherits ``os.environ`` reaches it, whatever ``~/.ray`` holds.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator

import pytest

from .. import _env
from . import simulation_env


@pytest.fixture
def ascend_env() -> dict[str, str]:
    return simulation_env(2)


@pytest.fixture(scope="session")
def npu_ray_cluster() -> Iterator[object]:
    if importlib.util.find_spec("ray") is None:
        pytest.skip("needs ray (installed by the upstream stack sessions)")
    from ._ray import npu_ray_cluster as cluster

    with cluster(npus=2, cpus=4) as handle:
        saved = {name: os.environ.get(name) for name in (*handle.auth_env, _env.RAY_AUTH_TOKEN)}
        os.environ.pop(_env.RAY_AUTH_TOKEN, None)
        os.environ.update(handle.auth_env)
        try:
            yield handle
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
