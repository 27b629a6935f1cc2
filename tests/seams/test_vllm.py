"""The vLLM seam: vLLM's ``vllm.general_plugins`` entry point activates npu-compat in each vLLM process."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import pytest

from .conftest import PROBE, child_env, last_json, py, report_for

pytest.importorskip("vllm", reason="needs vllm (installed by the upstream stack sessions)")
if not any(ep.name == "npu_compat" for ep in metadata.entry_points(group="vllm.general_plugins")):
    pytest.skip(
        "npu-compat's vllm.general_plugins entry point is not registered (not installed)",
        allow_module_level=True,
    )

LOAD = "from vllm.plugins import load_general_plugins\nload_general_plugins()\n"


def test_vllm_loads_the_plugin_and_it_activates(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    env = child_env({"NPU_COMPAT_DEVICE": "npu", "NPU_COMPAT_REPORT_DIR": str(reports)}, auto=False)
    out = last_json(py(LOAD + PROBE, env, timeout=180))
    assert out["active"] and out["via"] == "vllm-plugin"  # type: ignore[index]
    rep = report_for(reports, out["pid"])  # type: ignore[index, arg-type]
    assert rep is not None and rep["role"] == "vllm (MainProcess)"


def test_the_plugin_is_a_cheap_no_op_on_cpu() -> None:
    out = last_json(py(LOAD + PROBE, child_env(auto=False), timeout=180))
    assert not out["active"]  # type: ignore[index]
    assert out["loaded"] == ["npu_compat", "npu_compat._autostart", "npu_compat._env", "npu_compat._seams"]  # type: ignore[index]
    assert "PostImportFinder" not in out["finders"]  # type: ignore[index]


def test_vllm_plugins_allow_list_can_leave_it_out() -> None:
    env = child_env({"NPU_COMPAT_DEVICE": "npu", "VLLM_PLUGINS": "something_else"}, auto=False)
    out = last_json(py(LOAD + PROBE, env, timeout=180))
    assert not out["active"]  # type: ignore[index]
