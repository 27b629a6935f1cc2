"""A real local Ray cluster that advertises only NPUs, for tests (bounded waits everywhere).

:func:`npu_ray_cluster` runs ``ray start --head --block`` in its own process group,
with ``--num-gpus=0`` and ``--resources={"NPU": n}``, under the simulated Ascend
environment, waits (bounded) until the head answers, yields its address, and on exit
terminates that process group only -- never ``ray stop``, which would take down every
Ray cluster on the machine.

Authentication is the cluster's own, never the user's.  A Ray with token authentication (2.60
here) decides it per process: with ``RAY_AUTH_MODE`` unset, ``ray start --head`` turns it on as
soon as it finds a token (``~/.ray/auth_token``, left by any earlier local ``ray.init()``), while
``ray status`` and ``ray.init(address=...)`` stay disabled and are refused.  So the cluster
always runs with ``RAY_AUTH_MODE=token`` and a fresh token of its own, in a file in its temporary
directory that only this user can read, and hands the same two variables
(:attr:`RayCluster.auth_env`) to every client through :attr:`RayCluster.env`.  The user's own
token file is never read, written or removed.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .. import _env
from . import simulation_env


@dataclass
class RayCluster:
    """A running cluster.  ``env`` is the environment of ``ray start``: give it (or at least
    ``auth_env``) to every client -- a driver, ``ray status``, ``trinity run``."""

    address: str
    env: dict[str, str]
    temp_dir: Path
    log: Path
    resources: dict[str, float] = field(default_factory=dict)
    #: The cluster's authentication setting, the same for the head and every client.
    auth_env: dict[str, str] = field(default_factory=dict)


def cluster_auth_env(temp_dir: Path) -> dict[str, str]:
    """Token authentication with a fresh token of the cluster's own, written to ``temp_dir``.

    The token file is created for this user only (mode 0600) and goes away with ``temp_dir``.
    ``RAY_AUTH_TOKEN_PATH`` wins over ``~/.ray/auth_token`` in every Ray process that is given
    it, so what the user's home directory holds no longer matters.
    """
    token_file = temp_dir / "auth_token"
    fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(secrets.token_hex(32))  # Ray's own format: 256 bits, hex
    return {_env.RAY_AUTH_MODE: "token", _env.RAY_AUTH_TOKEN_PATH: str(token_file)}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_for_port(port: int, deadline: float, proc: subprocess.Popen[bytes], log: Path) -> None:
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"ray start exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.2)
    raise TimeoutError(f"the Ray head did not listen on port {port} in time:\n{log.read_text()[-4000:]}")


@contextlib.contextmanager
def npu_ray_cluster(
    npus: int = 2,
    cpus: int = 4,
    *,
    env: Mapping[str, str] | None = None,
    command_prefix: list[str] | None = None,
    start_timeout: float = 120,
) -> Iterator[RayCluster]:
    """A simulated Ascend Ray cluster: ``{"NPU": npus}``, no GPU.  Yields a :class:`RayCluster`.

    ``command_prefix`` is put before ``ray start`` (e.g. ``[sys.executable, "-m", "npu_compat"]``
    to start the head through the launcher).
    """
    temp_dir = Path(tempfile.mkdtemp(prefix="ncray-", dir="/tmp"))  # Ray's socket paths must stay short
    log = temp_dir / "ray-start.log"
    port = _free_port()
    cluster_env = simulation_env(npus, env)
    cluster_env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    auth_env = cluster_auth_env(temp_dir)
    cluster_env.pop(_env.RAY_AUTH_TOKEN, None)  # an inherited token would win over the cluster's file
    cluster_env.update(auth_env)
    # Every process of the cluster inherits this env: one that is not a Ray worker but calls
    # ``ray.init()`` (vLLM's worker processes, whose parent is a Ray actor, look up Trinity's
    # Synchronizer) finds a cluster started with Ray's default temp dir through its
    # ``ray_current_cluster`` file; this one's temp dir is private, so it is named here.
    cluster_env[_env.RAY_ADDRESS] = f"127.0.0.1:{port}"
    ray_bin = str(Path(sys.executable).with_name("ray"))
    argv = [
        *(command_prefix or []),
        ray_bin if os.path.exists(ray_bin) else "ray",
        "start", "--head", "--block",
        f"--port={port}",
        f"--num-cpus={cpus}", "--num-gpus=0",
        f"--resources={json.dumps({'NPU': npus})}",
        "--include-dashboard=false", "--disable-usage-stats",
        f"--temp-dir={temp_dir}",
    ]  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv, env=cluster_env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        _wait_for_port(port, time.monotonic() + start_timeout, proc, log)
        yield RayCluster(
            f"127.0.0.1:{port}",
            cluster_env,
            temp_dir,
            log,
            {"NPU": float(npus), "CPU": float(cpus)},
            auth_env,
        )
    finally:
        # `ray start --block` stops its cluster on SIGTERM to itself (not to its group)
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        # raylet children started in new sessions by Ray itself: find them by temp dir
        _kill_leftovers(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)


def _kill_leftovers(temp_dir: Path) -> None:
    marker = str(temp_dir).encode()
    for pid_dir in Path("/proc").iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            cmdline = (pid_dir / "cmdline").read_bytes()
        except OSError:
            continue
        if marker in cmdline:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(pid_dir.name), signal.SIGKILL)
