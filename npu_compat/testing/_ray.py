"""A real local Ray cluster that advertises only NPUs, for tests (bounded waits everywhere).

:func:`npu_ray_cluster` runs one ``ray start --block`` per node in its own process group -- the
head, then ``nodes - 1`` more raylets on this machine that join it -- each with ``--num-gpus=0``
and ``--resources={"NPU": m}`` under the simulated Ascend environment, waits (bounded) until every
node is alive, yields the address, and on exit stops those processes and what they started only
-- never ``ray stop``, which would take down every Ray cluster on the machine.

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
import re
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
from ._host import simulation_env


@dataclass
class RayCluster:
    """A running cluster.  ``env`` is the environment of ``ray start``: give it (or at least
    ``auth_env`` and ``RAY_ADDRESS``) to every client -- a driver, ``ray status``, ``trinity run``."""

    address: str
    env: dict[str, str]
    temp_dir: Path
    log: Path
    #: The whole cluster's resources: ``{"NPU": nodes * npus_per_node, "CPU": nodes * cpus_per_node}``.
    resources: dict[str, float] = field(default_factory=dict)
    #: The cluster's authentication setting, the same for the head and every client.
    auth_env: dict[str, str] = field(default_factory=dict)
    #: How many nodes (raylets) it has, and each one's resources.
    nodes: int = 1
    node_resources: dict[str, float] = field(default_factory=dict)
    #: The ``ray start --block`` processes, the head first.
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list, repr=False)

    def exited(self) -> str | None:
        """None while every node's ``ray start`` runs; else which one exited, with its status."""
        for index, proc in enumerate(self.processes):
            if proc.poll() is not None:
                return f"node {index}'s `ray start` exited with status {proc.returncode}"
        return None

    def node_temp_dir(self, index: int) -> Path:
        """Node ``index``'s Ray temporary directory: the head's is :attr:`temp_dir`, each other node's
        is its own below it, as each host of a real cluster has its own ``/tmp/ray``."""
        return self.temp_dir if index == 0 else self.temp_dir / f"node{index}"

    def log_dirs(self) -> list[Path]:
        """Each node's Ray logs (``session_latest/logs``), the head's first."""
        return [self.node_temp_dir(i) / "session_latest" / "logs" for i in range(self.nodes)]

    def client_env(self) -> dict[str, str]:
        """What a client process needs beyond its own environment: the simulation, the address and
        the authentication (the variables the shell command prints and writes to ``--env-file``)."""
        names = [
            _env.RAY_ADDRESS, *self.auth_env, _env.SIMULATE, _env.SIMULATE_DEVICES,
            _env.SIMULATE_VLLM_PLATFORM, _env.ASCEND_VISIBLE_DEVICES, _env.ASCEND_TOOLKIT_VARS[0],
            "PYTHONPATH",
        ]  # fmt: skip
        return {name: self.env[name] for name in names if name in self.env}


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


#: Linux's ephemeral range where its own setting cannot be read (``net.ipv4.ip_local_port_range``).
_EPHEMERAL_DEFAULT = (32768, 60999)
#: Below it, Ray's own fixed ports end here (its workers take 10002-19999 by default).
_FIXED_PORTS_END = 20000


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _EPHEMERAL_DEFAULT[0]


def _free_port() -> int:
    """A port on 127.0.0.1 that is free now and stays free until its user binds it.

    A port that ``bind(("", 0))`` hands out comes from the kernel's ephemeral range, which every
    outbound connection of every process draws from too: on a busy host another process can take it
    in the seconds before a store or a GCS binds it (``EADDRINUSE``), or, worse, listen on it so that
    a rank meets another run's store.  So the port is drawn at random between Ray's fixed ports and
    the ephemeral range, where only a process that asks for that very port can take it; the
    ephemeral way where that range is too narrow.
    """
    low = _ephemeral_low()
    if low - _FIXED_PORTS_END >= 1000:
        draw = secrets.SystemRandom()
        for _ in range(64):
            port = draw.randrange(_FIXED_PORTS_END, low)
            with socket.socket() as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _ray_executable() -> str:
    """The ``ray`` beside this interpreter (a venv's), else the one on ``PATH``."""
    beside = Path(sys.executable).with_name("ray")
    return str(beside) if beside.exists() else "ray"


def _check_running(procs: list[subprocess.Popen[bytes]], logs: list[Path]) -> None:
    """Raise, with the end of its log, if one of the ``ray start`` processes has exited."""
    for proc, log in zip(procs, logs, strict=True):
        if proc.poll() is not None:
            raise RuntimeError(f"ray start exited with {proc.returncode}:\n{log.read_text()[-4000:]}")


def _wait_for_port(port: int, deadline: float, proc: subprocess.Popen[bytes], log: Path) -> None:
    while time.monotonic() < deadline:
        _check_running([proc], [log])
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.2)
    raise TimeoutError(f"the Ray head did not listen on port {port} in time:\n{log.read_text()[-4000:]}")


def _ray_start(
    argv_tail: list[str], env: Mapping[str, str], log: Path, prefix: list[str] | None
) -> subprocess.Popen[bytes]:
    """``ray start ... --block`` in its own process group, its output to ``log``."""
    argv = [*(prefix or []), _ray_executable(), "start", "--block", *argv_tail]
    with log.open("wb") as out:
        return subprocess.Popen(
            argv, env=dict(env), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """``ray start --block`` stops what it started on SIGTERM to itself (not to its group)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def _active_nodes(status: str) -> int:
    """How many nodes ``ray status`` lists as active (its "Active:" section, up to "Pending:")."""
    active = status.partition("Active:")[2].partition("Pending:")[0]
    return len(re.findall(r"^\s*\d+ node_[0-9a-f]+\s*$", active, re.MULTILINE))


#: The longest the autoscaler's log may keep ``ray status`` from being asked, in seconds.
_QUIET_AT_MOST_S = 10.0


def _monitor_active(monitor_log: Path) -> int | None:
    """How many nodes the autoscaler's last report in the head's ``monitor.log`` lists as active (the
    report ``ray status`` prints); None before its first report."""
    try:
        text = monitor_log.read_text(errors="replace")
    except OSError:
        return None
    _, found, report = text.rpartition("Autoscaler status:")
    return _active_nodes(report) if found else None


def _wait_for_nodes(
    address: str, nodes: int, env: Mapping[str, str], deadline: float, procs: list[subprocess.Popen[bytes]],
    logs: list[Path], monitor_log: Path | None = None,
) -> None:  # fmt: skip
    """Until ``ray status`` (the autoscaler's view, which placement groups see too) lists ``nodes``.

    ``ray status`` is a Ray client of its own, about 3 s of a core here.  With ``monitor_log`` (the
    head's ``monitor.log``), it is asked only once the autoscaler has logged a report that lists
    ``nodes``, or after :data:`_QUIET_AT_MOST_S` without asking (a log in another format)."""
    argv = [_ray_executable(), "status", "--address", address]
    last = ""
    asked = time.monotonic()
    while time.monotonic() < deadline:
        _check_running(procs, logs)
        if monitor_log is not None and time.monotonic() - asked < _QUIET_AT_MOST_S:
            seen = _monitor_active(monitor_log)
            if seen is None or seen < nodes:
                time.sleep(0.2)
                continue
        asked = time.monotonic()
        with contextlib.suppress(subprocess.TimeoutExpired):
            out = subprocess.run(argv, env=dict(env), capture_output=True, text=True, timeout=60, check=False)
            last = out.stdout + out.stderr
            if out.returncode == 0 and _active_nodes(out.stdout) >= nodes:
                return
        time.sleep(1)
    raise TimeoutError(f"{nodes} Ray nodes were not active in time; last `ray status`:\n{last[-2000:]}")


#: What ``ray start`` says when its node's raylet did not register within Ray's fixed 30 s (a loaded host).
_HEAD_TIMED_OUT = "The current node timed out during startup"

#: How many times the head is started before its failure to start is the cluster's.
HEAD_TRIES = 3


def _start_head(
    node_args: list[str], env: dict[str, str], log: Path, prefix: list[str] | None, deadline: float,
    procs: list[subprocess.Popen[bytes]], monitor_log: Path | None = None,
) -> str:  # fmt: skip
    """Start the head (appended to ``procs``) and return its address once ``ray status`` lists it.

    ``ray start`` gives its own raylet a fixed 30 s to register and then takes the GCS down with it: on a
    loaded host it does so now and then.  That failure, and only that one, starts the head again on a
    fresh port (``HEAD_TRIES`` times in all); ``env`` gets the address (``RAY_ADDRESS``) it ended on.
    """
    for attempt in range(1, HEAD_TRIES + 1):
        port = _free_port()
        address = f"127.0.0.1:{port}"
        env[_env.RAY_ADDRESS] = address
        head_args = ["--head", f"--port={port}", "--include-dashboard=false", *node_args]
        procs.append(_ray_start(head_args, env, log, prefix))
        try:
            _wait_for_port(port, deadline, procs[0], log)
            _wait_for_nodes(address, 1, env, deadline, procs, [log], monitor_log)
            return address
        except RuntimeError:
            if attempt == HEAD_TRIES or _HEAD_TIMED_OUT not in log.read_text(errors="replace"):
                raise
            _stop(procs.pop())
            log.rename(log.with_name(f"ray-start.try{attempt}.log"))
    raise AssertionError("unreachable")


@contextlib.contextmanager
def npu_ray_cluster(
    nodes: int = 1,
    npus_per_node: int = 2,
    cpus_per_node: int = 4,
    *,
    env: Mapping[str, str] | None = None,
    command_prefix: list[str] | None = None,
    start_timeout: float = 120,
) -> Iterator[RayCluster]:
    """A simulated Ascend Ray cluster on this machine: ``nodes`` raylets, each advertising
    ``{"NPU": npus_per_node}`` and ``cpus_per_node`` CPUs, and no GPU.  Yields a :class:`RayCluster`
    once every node is alive.

    Each node is a simulated Ascend host of ``npus_per_node`` NPUs (``ASCEND_RT_VISIBLE_DEVICES``
    ``0..M-1`` in its raylet's environment; Ray gives each worker that asks for ``{"NPU": k}`` its
    own of them).  ``env`` is the environment to start from (default: this process's);
    ``command_prefix`` goes before ``ray start`` (e.g. ``[sys.executable, "-m", "npu_compat"]`` to
    start the nodes through the launcher).
    """
    if nodes < 1 or npus_per_node < 0 or cpus_per_node < 1:
        raise ValueError(f"nodes={nodes}, npus_per_node={npus_per_node}, cpus_per_node={cpus_per_node}: "
                         "a cluster has at least one node and one CPU per node")  # fmt: skip
    temp_dir = Path(tempfile.mkdtemp(prefix="ncray-", dir="/tmp"))  # Ray's socket paths must stay short
    log = temp_dir / "ray-start.log"
    cluster_env = simulation_env(npus_per_node, env)
    cluster_env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    auth_env = cluster_auth_env(temp_dir)
    cluster_env.pop(_env.RAY_AUTH_TOKEN, None)  # an inherited token would win over the cluster's file
    cluster_env.update(auth_env)
    # Every process of the cluster inherits this env: one that is not a Ray worker but calls
    # ``ray.init()`` (vLLM's worker processes, whose parent is a Ray actor, look up Trinity's
    # Synchronizer) finds a cluster started with Ray's default temp dir through its
    # ``ray_current_cluster`` file; this one's temp dir is private, so it is named here.
    node_args = [
        f"--num-cpus={cpus_per_node}", "--num-gpus=0",
        f"--resources={json.dumps({'NPU': npus_per_node})}",
        "--disable-usage-stats",
    ]  # fmt: skip
    procs: list[subprocess.Popen[bytes]] = []
    logs = [log]
    try:
        deadline = time.monotonic() + start_timeout
        head_args = [*node_args, f"--temp-dir={temp_dir}"]
        monitor_log = temp_dir / "session_latest" / "logs" / "monitor.log"
        address = _start_head(head_args, cluster_env, log, command_prefix, deadline, procs, monitor_log)
        for index in range(1, nodes):
            # a temporary directory per node, as on separate hosts: sharing the head's, every node's log
            # monitor would forward every worker's output to the drivers (each line once per node)
            node_temp = temp_dir / f"node{index}"
            logs.append(temp_dir / f"ray-start-node{index}.log")
            procs.append(
                _ray_start(
                    [f"--address={address}", *node_args, f"--temp-dir={node_temp}"], cluster_env, logs[-1],
                    command_prefix,
                )
            )  # fmt: skip
        # a cluster is handed over only once `ray status` lists all its nodes (the head's start saw one)
        if nodes > 1:
            _wait_for_nodes(
                address, nodes, cluster_env, deadline + 60 * (nodes - 1), procs, logs, monitor_log
            )
        per_node = {"NPU": float(npus_per_node), "CPU": float(cpus_per_node)}
        yield RayCluster(
            address,
            cluster_env,
            temp_dir,
            log,
            {name: amount * nodes for name, amount in per_node.items()},
            auth_env,
            nodes,
            per_node,
            procs,
        )
    finally:
        for proc in reversed(procs):  # the worker nodes first, then the head
            _stop(proc)
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
