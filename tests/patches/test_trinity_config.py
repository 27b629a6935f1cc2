"""trainer.device: the default becomes npu (verl then builds NPU placement groups); a user's own value is kept."""

from __future__ import annotations

from typing import Any

import pytest

from npu_compat.testing import simulation_env
from tests.conftest import SIM_PATH, last_json, run_py, upstream_versions

#: exercises verl: stack-b (stack-a with another verl) runs it (noxfile)
pytestmark = pytest.mark.uses_verl

TRINITY, VERL = upstream_versions("trinity-rft", "verl")

if TRINITY.startswith("0.5."):
    MODULE = "trinity.trainer.verl.verl_config"
elif tuple(int(p) for p in VERL.split(".")[:2]) < (0, 8):
    MODULE = "trinity.trainer.verl_legacy.verl_config"
else:
    pytest.skip(
        "trinity 0.6 with verl >= 0.8 has no Trainer.device (VERLTrainer sets device_name)",
        allow_module_level=True,
    )


def _devices(activate: bool) -> Any:
    sim = {k: v for k, v in simulation_env(2, {}).items() if k != "PYTHONPATH"}
    return last_json(
        run_py(
            f"""
            import json
            import npu_compat
            {"npu_compat.activate()" if activate else ""}
            from omegaconf import OmegaConf
            from {MODULE} import veRLConfig
            schema = OmegaConf.structured(veRLConfig)   # how Trinity's validator builds a user's trainer_config
            def device(user):
                return OmegaConf.to_object(OmegaConf.merge(schema, user)).trainer.device
            print(json.dumps({{"plain": veRLConfig().trainer.device, "yaml_default": device({{}}),
                              "yaml_cuda": device({{"trainer": {{"device": "cuda"}}}}),
                              "yaml_npu": device({{"trainer": {{"device": "npu"}}}})}}))
            """,
            env=sim,
            pythonpath=SIM_PATH,
            timeout=300,
        )
    )


def test_default_device_is_npu_and_explicit_values_are_kept() -> None:
    assert _devices(activate=True) == {
        "plain": "npu",
        "yaml_default": "npu",
        "yaml_cuda": "cuda",
        "yaml_npu": "npu",
    }


def test_stock_default_is_cuda() -> None:
    assert _devices(activate=False) == {
        "plain": "cuda",
        "yaml_default": "cuda",
        "yaml_cuda": "cuda",
        "yaml_npu": "npu",
    }
