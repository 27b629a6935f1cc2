"""The main job's verdict (``examples/e2e/demo.py``) when both runs stop before anything device-related.

The summaries are shaped as ``tests/e2e/scenario.py`` returns them; the first is what the demo met on a
machine holding ``~/.ray/auth_token`` (both drivers stopped by Trinity's ``is_running()``).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import REPO

NOT_RUNNING = "RuntimeError: Ray is not running, please start it by `ray start --head`."


@pytest.fixture(scope="module")
def demo() -> ModuleType:
    spec = importlib.util.spec_from_file_location("npu_compat_demo", REPO / "examples" / "e2e" / "demo.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def summary(
    cluster: str, stages: list[str], rc: object, error: str | None, **more: object
) -> dict[str, object]:
    return {"cluster": cluster, "stages": stages, "rc": rc, "first_error": error, "boundaries": [], **more}


def test_the_same_crash_before_the_device_is_the_environment(demo: ModuleType, tmp_path: Path) -> None:
    stock = summary("explicit", [], 1, NOT_RUNNING, wall_s=9.0)
    compat = summary("auto", [], 1, NOT_RUNNING, wall_s=10.0)
    assert demo.environment_failure(stock, compat) == NOT_RUNNING
    # past config validation, or stopped differently, it is no longer the environment's doing
    assert demo.environment_failure(stock, summary("auto", ["npus_counted", "config_validated",
                                                             "explorer_actor"], 1, NOT_RUNNING)) is None  # fmt: skip
    assert (
        demo.environment_failure(stock, summary("auto", [], 1, "ZeroDivisionError: division by zero")) is None
    )
    assert demo.environment_failure(summary("explicit", ["config_validated"], "stuck", None), compat) is None
    assert demo.environment_failure(stock, {**compat, "boundaries": ["fsdp2"]}) is None
    # what a stock crash in validation (the GPU count) and a compat run that got on looks like: no verdict
    stock_gpu = summary("auto", [], 1, "ZeroDivisionError: division by zero")
    assert demo.environment_failure(stock_gpu, summary("auto", ["npus_counted"], 1, "Boom: later")) is None
