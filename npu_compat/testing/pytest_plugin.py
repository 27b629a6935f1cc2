"""pytest fixtures for a simulated Ascend host.  Enable with ``-p npu_compat.testing.pytest_plugin``.

* ``ascend_host`` -- this test runs on a simulated Ascend host (:func:`simulated_ascend`): ``npu``
  tensors, ``hccl``, the stand-ins installed; the environment and ``sys.path`` are restored after.
  Entered at any time, also after a CPU reference computed a backward.
* ``ascend_env`` -- the environment of a simulated Ascend host (for subprocesses).
* ``npu_ray_cluster`` -- one real local Ray cluster per test session that advertises only NPUs
  (no GPU); skipped with a reason when Ray is not installed.  Its size comes from the command line
  or the ini file (command line first), default one node of 2 NPUs and 4 CPUs:

  ========================  =====================  ==========================
  command line              ini key                meaning
  ========================  =====================  ==========================
  ``--npu-nodes N``         ``npu_nodes``          raylets (nodes) on this machine
  ``--npus-per-node M``     ``npus_per_node``      ``{"NPU": M}`` on each node
  ``--npu-cpus-per-node K`` ``npu_cpus_per_node``  CPUs on each node
  ========================  =====================  ==========================

  While it lives, this process's environment carries the cluster's authentication setting
  (``RayCluster.auth_env``), so ``ray.init(address=npu_ray_cluster.address)`` here and in every
  child that inherits ``os.environ`` reaches it, whatever ``~/.ray`` holds.  ``RAY_ADDRESS`` is
  left alone (a test that starts a Ray of its own must not join this one): give a child
  ``npu_ray_cluster.env``, or ``RAY_ADDRESS=npu_ray_cluster.address``.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator

import pytest

from .. import _env
from ._host import simulated_ascend, simulation_env

#: (option, ini key, default, help)
SIZE_OPTIONS = (
    ("--npu-nodes", "npu_nodes", 1, "nodes (raylets) of the npu_ray_cluster fixture's cluster"),
    ("--npus-per-node", "npus_per_node", 2, "NPUs each node of the npu_ray_cluster fixture advertises"),
    ("--npu-cpus-per-node", "npu_cpus_per_node", 4, "CPUs each node of the npu_ray_cluster fixture has"),
)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("npu_compat", "simulated Ascend (npu_compat.testing)")
    for option, ini, default, text in SIZE_OPTIONS:
        group.addoption(option, type=int, default=None, help=f"{text} (default {default}; ini: {ini})")
        parser.addini(ini, f"{text} (default {default})", default=str(default))


def cluster_size(config: pytest.Config) -> tuple[int, int, int]:
    """``(nodes, npus_per_node, cpus_per_node)`` from the command line, else the ini file."""
    size = []
    for option, ini, _, _ in SIZE_OPTIONS:
        value = config.getoption(option)
        raw = value if value is not None else config.getini(ini)
        try:
            size.append(int(raw))
        except ValueError:
            raise pytest.UsageError(f"{ini} = {raw!r}: a whole number is needed") from None
    return (size[0], size[1], size[2])


@pytest.fixture
def ascend_host() -> Iterator[None]:
    with simulated_ascend():
        yield


@pytest.fixture
def ascend_env() -> dict[str, str]:
    return simulation_env(2)


@pytest.fixture(scope="session")
def npu_ray_cluster(pytestconfig: pytest.Config) -> Iterator[object]:
    if importlib.util.find_spec("ray") is None:
        pytest.skip("needs ray (installed by the upstream stack sessions)")
    from ._ray import npu_ray_cluster as cluster

    (nodes, npus, cpus) = cluster_size(pytestconfig)
    with cluster(nodes, npus, cpus) as handle:
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
