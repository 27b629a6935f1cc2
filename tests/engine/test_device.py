"""The device decision, read from the environment and the host without importing torch."""

from __future__ import annotations

from pathlib import Path

import pytest

from npu_compat import ConfigError, _env


@pytest.fixture(autouse=True)
def no_dev(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    dev = tmp_path / "dev"
    dev.mkdir()
    monkeypatch.setattr(_env.startup, "DEV_DIR", str(dev))
    monkeypatch.setattr(_env.startup, "torch_npu_findable", lambda: False)
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
    monkeypatch.setattr(_env.startup, "DEV_DIR", str(tmp_path / "nothing"))
    assert _env.decide(environ={}).device == "cpu"
    (tmp_path / "torch_npu").mkdir()
    (tmp_path / "torch_npu" / "__init__.py").write_text("raise ImportError('must not be imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    decision = _env.decide(environ={})
    assert decision.device == "npu"
    assert decision.evidence == ("torch_npu is importable",)


@pytest.mark.parametrize(
    ("environ", "problem"),
    [
        ({"NPU_COMPAT_STRICT": "maybe"}, "NPU_COMPAT_STRICT='maybe' is neither on"),
        ({"NPU_COMPAT_AUTO": "never"}, "NPU_COMPAT_AUTO='never' is neither on (1, true, yes, on) nor off"),
        ({"NPU_COMPAT_SIMULATE_DEVICES": "two"}, "NPU_COMPAT_SIMULATE_DEVICES='two': give the number"),
        ({"NPU_COMPAT_SIMULATE_DEVICES": "0"}, "a whole number of at least 1"),
        ({"NPU_COMPAT_SIMULATE_NPU_MEMORY": "lots"}, "give bytes, or a number with KiB, MiB or GiB"),
        ({"NPU_COMPAT_REPORTS_DIR": "/tmp/r"}, "has no effect; did you mean NPU_COMPAT_REPORT_DIR?"),
        ({"NPU_COMPAT_FROBNICATE": "1"}, "NPU_COMPAT_FROBNICATE is not a variable npu-compat reads"),
    ],
)
def test_a_wrong_value_or_name_of_ours_is_one_sentence(environ: dict[str, str], problem: str) -> None:
    (found,) = _env.value_problems(environ)
    assert problem in found, found


def test_good_values_and_other_projects_variables_are_no_problem() -> None:
    environ = {
        "NPU_COMPAT": "1", "NPU_COMPAT_STRICT": "true", "NPU_COMPAT_AUTO": "0", "NPU_COMPAT_SIMULATE": "",
        "NPU_COMPAT_SIMULATE_DEVICES": "8", "NPU_COMPAT_SIMULATE_NPU_MEMORY": "1.5GiB",
        "NPU_COMPAT_DISABLE": "x,y", "NPU_COMPAT_DEVICE": "npu", "TRINITY_DEVICE": "whatever", "PATH": "/bin",
    }  # fmt: skip
    assert _env.value_problems(environ) == []
    assert (
        _env.parse_size("1.5GiB") == 3 << 29
        and _env.parse_size("512") == 512
        and _env.parse_size("x") is None
    )


@pytest.mark.parametrize(
    ("value", "on"), [(None, True), ("1", True), ("0", False), ("false", False), ("off", False)]
)
def test_the_simulated_vllm_platform_is_off_for_every_off_value(value: str | None, on: bool) -> None:
    from npu_compat.testing._sites import vllm_platform_on

    environ = {} if value is None else {"NPU_COMPAT_SIMULATE_VLLM_PLATFORM": value}
    assert vllm_platform_on(environ) is on
