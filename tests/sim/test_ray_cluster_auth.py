"""The simulated NPU-only Ray cluster on a machine that has used Ray before.

Ray 2.60's ``ray.init()`` of a local cluster leaves a token in ``~/.ray/auth_token``.  From then
on, with ``RAY_AUTH_MODE`` unset, ``ray start --head`` turns token authentication on
(``maybe_enable_token_auth_if_token_available``), while ``ray status`` -- what Trinity's
``is_running()`` runs before anything else -- never loads the token and is refused.  The cluster
of ``npu_compat.testing`` must be found all the same, with the real ``ray start``, ``ray status``
and Trinity's own check, and must leave the user's token file as it was.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from npu_compat import _env
from npu_compat.testing._ray import _free_port, _kill_leftovers, npu_ray_cluster
from tests.conftest import REPO

#: torch and Ray alone, pinned alike in every stack: stack-a runs these (noxfile.SHARED_PINS)
pytestmark = pytest.mark.same_on_every_stack
pytest.importorskip("ray", reason="needs ray (installed by the upstream stack sessions)")
pytest.importorskip("trinity", reason="needs trinity-rft (installed by the upstream stack sessions)")

RAY = str(Path(sys.executable).with_name("ray"))
AUTH_VARS = (_env.RAY_AUTH_MODE, _env.RAY_AUTH_TOKEN, _env.RAY_AUTH_TOKEN_PATH)


@pytest.fixture
def used_home(tmp_path: Path) -> tuple[Path, str]:
    """A throw-away home directory holding a token file, as an earlier local ``ray.init()`` leaves it."""
    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    token = secrets.token_hex(32)
    (home / ".ray" / "auth_token").write_text(token)
    return home, token


def _user_env(home: Path) -> dict[str, str]:
    """A user's shell on that machine: ``RAY_AUTH_MODE`` unset, no token in the environment."""
    env = {k: v for k, v in os.environ.items() if k not in AUTH_VARS and not k.startswith("NPU_COMPAT")}
    env.update(HOME=str(home), RAY_USAGE_STATS_ENABLED="0", NPU_COMPAT_AUTO="0")
    return env


def _status(address: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [RAY, "status", f"--address={address}"], env=env, capture_output=True, text=True, timeout=120
    )


def test_a_plain_head_in_a_used_home_refuses_ray_status(used_home: tuple[Path, str]) -> None:
    """The failure itself, with the real ``ray start --head`` and ``ray status``: what the demo met."""
    home, _ = used_home
    env = _user_env(home)
    temp_dir = Path(tempfile.mkdtemp(prefix="ncauth-", dir="/tmp"))
    port = _free_port()
    try:
        start = subprocess.run(
            [RAY, "start", "--head", f"--port={port}", "--num-cpus=1", "--num-gpus=0",
             "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp_dir}"],
            env=env, capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        assert start.returncode == 0, start.stdout + start.stderr
        assert "Token authentication is enabled" in start.stdout + start.stderr
        status = _status(f"127.0.0.1:{port}", env)
    finally:
        _kill_leftovers(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert status.returncode != 0
    assert "InvalidAuthToken" in status.stdout + status.stderr


def test_the_simulated_cluster_is_found_in_a_used_home(used_home: tuple[Path, str]) -> None:
    home, token = used_home
    with npu_ray_cluster(npus_per_node=2, cpus_per_node=1, env=_user_env(home)) as cluster:
        deadline = time.monotonic() + 60  # right after the start, `ray status` may have no report yet
        while (
            status := _status(cluster.address, cluster.env)
        ).returncode == 0 and "NPU" not in status.stdout:
            if time.monotonic() > deadline:
                break
            time.sleep(1)
        trinity = subprocess.run(
            [sys.executable, "-c", "from trinity.utils.dlc_utils import is_running; print(is_running())"],
            env={**cluster.env, "RAY_ADDRESS": cluster.address},
            capture_output=True, text=True, timeout=120, cwd=str(REPO),
        )  # fmt: skip
        # a client that was not handed the cluster's setting is refused: authentication is on
        stranger = _status(cluster.address, _user_env(home))
        token_file = Path(cluster.env.get(_env.RAY_AUTH_TOKEN_PATH, "/nonexistent"))
        own = {
            "mode": cluster.env.get(_env.RAY_AUTH_MODE),
            "in_temp_dir": token_file.parent == cluster.temp_dir,
            "private": token_file.exists() and (token_file.stat().st_mode & 0o077) == 0,
            "not_the_users": token_file.exists() and token_file.read_text() != token,
        }
    assert status.returncode == 0, status.stdout + status.stderr
    assert "NPU" in status.stdout
    assert trinity.stdout.strip().splitlines()[-1:] == ["True"], trinity.stdout + trinity.stderr
    assert stranger.returncode != 0
    assert own == {"mode": "token", "in_temp_dir": True, "private": True, "not_the_users": True}
    assert (home / ".ray" / "auth_token").read_text() == token  # the user's file is untouched
    assert sorted(p.name for p in (home / ".ray").iterdir()) == ["auth_token"]
