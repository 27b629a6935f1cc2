"""Whether trinity-rft's verl config is one the installed verl accepts, on the CPU with npu-compat off:
a pair that fails here fails on every device, and is npu-compat's to name (``check``, ``doctor``:
``npu_compat.doctor.upstream.CONTRACTS``), not to patch.

On stacks a, b and c the checkpoint config Trinity 0.6 builds is accepted; on stack d (verl 0.9.1, on
request) it is refused, exactly as the whole run on stack d failed, stock and with npu-compat.
"""

from __future__ import annotations

import pytest

from tests.conftest import run_py, upstream_versions

#: exercises verl: stack-b (stack-a with another verl) runs it (noxfile)
pytestmark = pytest.mark.uses_verl

TRINITY, VERL = upstream_versions("trinity-rft", "verl")

BUILD = """
import json
from omegaconf import OmegaConf
from trinity.trainer.verl.config import _build_checkpoint_config
from verl.utils.config import omega_conf_to_dataclass
import torch
conf = OmegaConf.create({"_target_": "verl.trainer.config.CheckpointConfig", **_build_checkpoint_config()})
try:
    omega_conf_to_dataclass(conf)
    error = None
except Exception as exc:
    error = f"{type(exc).__name__}: {exc}"
print(json.dumps({"cuda": torch.cuda.is_available(), "error": error}))
"""


@pytest.mark.skipif(
    not TRINITY.startswith("0.6."), reason="trinity-rft 0.6's engine-path config (stacks a, b, d)"
)
def test_trinitys_checkpoint_config_is_accepted_by_this_verl_exactly_when_doctor_says_so() -> None:
    import json

    from npu_compat.doctor import check, source

    proc = run_py(BUILD, env={"NPU_COMPAT": "0"}, timeout=240)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["cuda"] is False  # the CPU: no device is involved in what follows
    artifact = source.installed("verl")
    assert artifact is not None
    named = check.broken_contracts(artifact, {"trinity-rft": TRINITY})
    if out["error"] is None:
        assert named == [], named
    else:
        assert "unexpected keyword argument 'mbridge_config'" in out["error"]
        assert [row.patch for row in named] == ["trinity-rft.verl.checkpoint_config.mbridge_config"]
        assert f"trinity-rft {TRINITY} cannot run on verl {VERL} on any device" in named[0].detail
