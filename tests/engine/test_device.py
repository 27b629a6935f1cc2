"""The device decision, read from the environment and the host without importing torch."""

from __future__ import annotations

from pathlib import Path

import pytest

from npu_compat import ConfigError, _env


@pytest.fixture(autouse=True)
def no_dev(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    dev = tmp_path / "dev"
    dev.mkdir()
    monkeypatch.setattr(_env, "DEV_DIR", str(dev))
    monkeypatch.setattr(_env, "_torch_npu_findable", lambda: False)
    return dev


def test_no_evidence_means_no_npu_work() -> None:
    decision = _env.decide(environ={})
    assert decision.device == "cpu"
    assert not decision.is_npu
    assert decision.evidence == ()


@pytest.mark.parametrize("value", ["npu", "cuda", "cpu", "NPU", " cuda "])
def test_explicit_env(value: str) -> None:
    decision = _env.decide(environ={"NPU_COMPAT_DEVICE": value})
    assert decision.device == value.strip().lower()
    assert decision.source == f"NPU_COMPAT_DEVICE={value}"


def test_trinity_device_is_honoured_and_ours_wins() -> None:
    assert _env.decide(environ={"TRINITY_DEVICE": "npu"}).device == "npu"
    both = _env.decide(environ={"TRINITY_DEVICE": "npu", "NPU_COMPAT_DEVICE": "cuda"})
    assert (both.device, both.source) == ("cuda", "NPU_COMPAT_DEVICE=cuda")
    auto = _env.decide(environ={"TRINITY_DEVICE": "npu", "NPU_COMPAT_DEVICE": "auto"})
    assert auto.device == "npu"


def test_argument_beats_environment() -> None:
    assert _env.decide("cuda", environ={"NPU_COMPAT_DEVICE": "npu"}).device == "cuda"


@pytest.mark.parametrize("name", ["NPU_COMPAT_DEVICE", "TRINITY_DEVICE"])
def test_invalid_value_lists_valid_ones(name: str) -> None:
    with pytest.raises(ConfigError) as err:
        _env.decide(environ={name: "gpu"})
    message = str(err.value)
    assert name in message and "'gpu'" in message
    for valid in ("npu", "cuda", "cpu", "auto"):
        assert valid in message


def test_off_switch_wins_over_everything() -> None:
    decision = _env.decide("npu", environ={"NPU_COMPAT": "0", "ASCEND_RT_VISIBLE_DEVICES": "0"})
    assert decision.device == "off"


def test_davinci_nodes_are_evidence(no_dev: Path) -> None:
    for i in range(3):
        (no_dev / f"davinci{i}").touch()
    decision = _env.decide(environ={})
    assert decision.device == "npu"
    assert decision.evidence == (f"{no_dev}/davinci0 (+2 more)",)


def test_visible_devices_and_toolkit_are_evidence() -> None:
    decision = _env.decide(environ={"ASCEND_RT_VISIBLE_DEVICES": "0,1", "ASCEND_HOME_PATH": "/x"})
    assert decision.device == "npu"
    assert decision.evidence == (
        "ASCEND_RT_VISIBLE_DEVICES=0,1",
        "ASCEND_HOME_PATH is set (CANN toolkit environment)",
    )


def test_findable_torch_npu_is_evidence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.undo()  # the real lookup this time
    monkeypatch.setattr(_env, "DEV_DIR", str(tmp_path / "nothing"))
    assert _env.decide(environ={}).device == "cpu"
    (tmp_path / "torch_npu").mkdir()
    (tmp_path / "torch_npu" / "__init__.py").write_text("raise ImportError('must not be imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    decision = _env.decide(environ={})
    assert decision.device == "npu"
    assert decision.evidence == ("torch_npu is importable",)
