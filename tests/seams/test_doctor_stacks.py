"""``doctor`` on the pinned stacks (``npu_compat/stacks/*.txt``): every one of them is a supported setup -- stack a's
whole ``trinity run`` finishes on the simulated Ascend -- so doctor may not warn about it, nor note that a
version of it is unsupported.

Runs in the stack sessions: it finds which stack this interpreter's installed packages are, and is skipped
where they are none of them (the engine session).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from npu_compat._versions import installed_version
from npu_compat.doctor import check

from .conftest import child_env, healthy_npu_host, pth_installed, run

# doctor's verdict on a stack turns on its verl (0.8.0 in stack a, 0.7.1 in b and c): stack-b runs it too
pytestmark = pytest.mark.uses_verl

#: The distributions npu-compat patches that name a stack (it patches vllm-ascend too, an Ascend host's own).
TARGETS = ("trinity-rft", "verl", "vllm", "ray", "torch")


def _this_stack() -> str | None:
    """The pin list in ``npu_compat/stacks/`` whose pins of the target distributions are what is installed here."""
    pins = check.stack_pins()
    stacks = sorted({stack for versions in pins.values() for stack in versions})
    for stack in stacks:
        if all(pins.get(d, {}).get(stack) == installed_version(d) for d in TARGETS):
            return f"{stack}.txt"
    return None


STACK = _this_stack()


@pytest.fixture(params=["cpu host", "simulated Ascend host"])
def doctor(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, object]:
    """``doctor --json`` on this stack, on a CPU host and on a healthy (simulated) Ascend host."""
    if STACK is None:
        pytest.skip("the installed packages are none of npu_compat/stacks/*.txt (run in a stack session)")
    if not pth_installed():
        pytest.skip("npu-compat is not installed in this environment (the stack sessions install it)")
    extra = {"HOME": str(tmp_path)}  # no Ray token left by another run: not this stack's concern
    if request.param == "simulated Ascend host":
        extra |= healthy_npu_host(tmp_path)
    proc = run([sys.executable, "-m", "npu_compat", "doctor", "--json"], child_env(extra), check=False)
    out: dict[str, object] = json.loads(proc.stdout)
    out["returncode"] = proc.returncode
    assert out["decision"]["device"] == ("npu" if "Ascend" in request.param else "cpu")  # type: ignore[index]
    return out


def test_doctor_neither_warns_nor_calls_a_version_of_a_supported_stack_unsupported(
    doctor: dict[str, object],
) -> None:
    findings: list[dict[str, str]] = doctor["findings"]  # type: ignore[assignment]
    assert doctor["ok"] and doctor["returncode"] == 0, (STACK, findings)
    loud = [f for f in findings if f["level"] != "note"]
    assert loud == [], (STACK, loud)
    # no note names an installed target distribution at its version ("verl 0.8.0 is outside ...")
    named = [f"{d} {installed_version(d)}" for d in TARGETS]
    about_versions = [f["message"] for f in findings if any(n in f["message"] for n in named)]
    assert about_versions == [], (STACK, about_versions)


def test_a_version_no_patch_supports_is_served_by_patches_that_would_apply(doctor: dict[str, object]) -> None:
    rows: list[dict[str, object]] = doctor["targets"]  # type: ignore[assignment]
    plans = {p["id"]: p for p in doctor["plans"]}  # type: ignore[attr-defined]
    for row in rows:
        if row["distribution"] not in TARGETS:  # an Ascend host's own (vllm-ascend): no stack pins it
            assert row["verdict"] in {"supported", "not installed"}, (STACK, row)
            continue
        assert row["verdict"] in {"supported", "no patch needed"}, (STACK, row)
        if row["verdict"] == "no patch needed":
            assert row["served_by"] and row["how"], row
            for pid in row["served_by"]:  # type: ignore[attr-defined]
                assert plans[pid]["plan"] == "would apply", (STACK, plans[pid])
    # a patch this stack's version is outside of finds nothing to change in it, or another patch of the
    # same target applies instead
    outside = [p for p in plans.values() if "is outside" in p["why"]]
    assert outside, STACK  # every stack leaves out another release's patches
    applied = {p["target"] for p in plans.values() if p["plan"] == "would apply"}
    unexplained = [p for p in outside if "nothing to patch" not in p["why"] and p["target"] not in applied]
    assert unexplained == [], (STACK, unexplained)
