"""Trinity's ``mode: bench`` and ``mode: serve`` on the simulated Ascend cluster.

Test harness, never part of ``npu_compat``.  Both modes are the Explorer alone (launcher ``bench`` / ``serve``,
``trinity/cli/launcher.py``): ``Explorer.prepare`` (the rollout's vLLM engine on one NPU), then

* ``bench``: ``Explorer.benchmark`` loads each ``global_step_N`` checkpoint under the run's checkpoint job
  directory into the engine (``sync_method`` ``checkpoint``: Trinity's validator turns ``nccl`` into it for
  every mode but ``both``), evaluates the config's ``eval_tasksets`` and logs ``bench/...`` metrics per step;
  the driver exits.  The checkpoint directory must hold checkpoints of a finished run with the same
  ``project``/``name`` (:func:`train_config` saves one each step).
* ``serve``: ``Explorer.sync_weight`` then ``Explorer.serve`` starts ``ExplorerService``, an OpenAI-compatible
  proxy (``trinity/explorer/proxy/app.py``) in front of the rollout's vLLM API server (mode ``serve`` turns
  ``enable_openai_api`` on), logs ``Starting Trinity Service on http://IP:PORT`` and serves until stopped.
  :func:`run_serve` starts such a driver, sends a chat completion through the proxy and stops the driver's
  process group.
"""

from __future__ import annotations

import ast
import contextlib
import json
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from npu_compat.testing._ray import npu_ray_cluster
from tests.e2e import scenario

_T = TypeVar("_T")

EVAL_TASKSET = "tiny_math_eval"

_EVAL = scenario.eval_tasksets(EVAL_TASKSET, temperature=1.0)


def train_config(text: str) -> str:
    """The bundled run (mode ``both``, ``nccl``, 2 steps), saving the trainer's checkpoint after every step."""
    return scenario.replaced(text, [("  save_interval: 0\n", "  save_interval: 1\n")])


def bench_config(checkpoint_root: Path) -> Callable[[str], str]:
    """Mode ``bench`` over ``checkpoint_root`` (a finished run's, same project and name), with an eval taskset."""

    def edit(text: str) -> str:
        return scenario.replaced(text, [
            ("\nmode: both\n", "\nmode: bench\n"),
            ("checkpoint_root_dir: ${oc.env:E2E_WORKDIR}/checkpoints\n", f"checkpoint_root_dir: {checkpoint_root}\n"),
            ("  trainer_input:\n", _EVAL + "  trainer_input:\n"),
        ])  # fmt: skip

    return edit


def serve_config(port: int) -> Callable[[str], str]:
    """Mode ``serve``: the proxy on ``port`` of every address (``listen_address`` 0.0.0.0, Trinity's default)."""

    def edit(text: str) -> str:
        return scenario.replaced(text, [
            ("\nmode: both\n", "\nmode: serve\n"),
            ("explorer:\n  eval_interval", f"explorer:\n  proxy_port: {port}\n  listen_address: 0.0.0.0\n  eval_interval"),
        ])  # fmt: skip

    return edit


_MONITOR = re.compile(r"\[monitor\.py:\d+\] Step (\d+): (\{.*\})")


def bench_metrics(out: Path) -> dict[int, dict[str, object]]:
    """The ``bench/...`` metrics the benchmarking Explorer's monitor logged, per checkpoint step."""
    found: dict[int, dict[str, object]] = {}
    for step, metrics in _MONITOR.findall(scenario._driver_log(out)):
        values = ast.literal_eval(metrics)
        bench = {k: v for k, v in values.items() if k.startswith("bench/")}
        if bench:
            found.setdefault(int(step), {}).update(bench)
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


SERVICE = re.compile(r"Starting Trinity Service on (http://[\w.:\[\]-]+)")


def _http(url: str, body: dict[str, object] | None = None, timeout: float = 120) -> dict[str, object]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def run_serve(
    out: Path,
    model: Path,
    timeout: float = 900,
    *,
    progress: Callable[[str], None] | None = None,
) -> dict[str, object]:
    """``python -m npu_compat trinity run`` in mode ``serve`` on a simulated 2-NPU cluster, asked once.

    Waits (bounded by ``timeout``) for the driver's ``Starting Trinity Service on URL``, lists the proxy's
    models (``GET /v1/models``), sends one ``POST /v1/chat/completions``, then SIGTERMs the driver's
    process group and stops the cluster.  Returns a summary: ``url``, ``models``, ``response`` (the
    completion), ``rc`` (the driver's status once stopped; ``"exited"`` with its status if it ended on its
    own before answering, ``"timeout"``), ``service_s`` (seconds to the URL), ``wall_s``, ``stages``,
    ``first_error`` and ``cluster_gone`` (no process left that names the cluster's temp dir)."""
    say = progress or (lambda line: None)
    out.mkdir(parents=True, exist_ok=True)
    workdir = out / "work"
    workdir.mkdir(exist_ok=True)
    env = scenario._env("compat", workdir, model)
    prefix = [sys.executable, "-m", "npu_compat"]
    trinity = str(Path(sys.executable).with_name("trinity"))
    port = free_port()
    config = scenario._edited(scenario.CONFIG, serve_config(port), workdir, "serve")
    summary: dict[str, object] = {"mode": "serve", "port": port}
    say("starting the simulated NPU-only Ray cluster ({'NPU': 2}, no GPU; through python -m npu_compat)")
    with npu_ray_cluster(
        npus_per_node=2, cpus_per_node=4, env=env, command_prefix=prefix, start_timeout=180
    ) as cluster:
        temp_dir = cluster.temp_dir
        driver_env = {**cluster.env, "RAY_ADDRESS": cluster.address}
        say(
            f"running `python -m npu_compat trinity run --config {config.name}` (mode serve, proxy port {port})"
        )
        started = time.monotonic()
        log_path = out / "driver.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [*prefix, trinity, "run", "--config", str(config)],
                env=driver_env, cwd=workdir, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
            try:
                summary.update(_ask(proc, log_path, started + timeout, say, started))
            finally:
                if proc.poll() is None:
                    say("stopping the driver: SIGTERM to its process group")
                    scenario._stop_group(proc)
                    summary.setdefault("rc", proc.returncode)
                summary["driver_rc"] = proc.returncode
        summary["wall_s"] = round(time.monotonic() - started, 1)
        say("collecting the logs; stopping the Ray cluster")
        scenario._collect(cluster.temp_dir, out)
        shutil_copy(cluster.log, out / "ray-start.log")
    summary["cluster_gone"] = not _processes_naming(str(temp_dir))
    summary["stages"] = scenario.stages_reached(out)
    summary["first_error"] = scenario.first_error(out)
    return summary


def shutil_copy(src: Path, dst: Path) -> None:
    with contextlib.suppress(OSError):
        dst.write_bytes(src.read_bytes())


def _processes_naming(marker: str) -> list[int]:
    pids = []
    for pid_dir in Path("/proc").iterdir():
        if pid_dir.name.isdigit():
            with contextlib.suppress(OSError):
                if marker.encode() in (pid_dir / "cmdline").read_bytes():
                    pids.append(int(pid_dir.name))
    return pids


def _ask(
    proc: subprocess.Popen[bytes], log: Path, deadline: float, say: Callable[[str], None], started: float
) -> dict[str, object]:
    """Wait for the service URL in the driver's output, then list models and ask one chat completion."""
    result: dict[str, object] = {}
    url = None
    while url is None:
        if proc.poll() is not None:
            return {"rc": f"exited {proc.returncode} before the service started"}
        if time.monotonic() >= deadline:
            return {"rc": "timeout"}
        time.sleep(scenario.POLL_S)
        match = SERVICE.search(log.read_text(errors="replace"))
        if match:
            url = match.group(1)
    result["url"] = url
    result["service_s"] = round(time.monotonic() - started, 1)
    say(f"  +{result['service_s']:.0f} s in the run: the driver logged the service URL {url}")
    # the proxy's uvicorn may still be binding when the line is logged: retry the first request a while
    for attempt in range(30):
        try:
            models = _http(f"{url}/v1/models", timeout=30)
            break
        except OSError as exc:
            if attempt == 29 or proc.poll() is not None:
                raise RuntimeError(f"the proxy at {url} did not answer GET /v1/models: {exc}") from exc
            time.sleep(2)
    result["models"] = models
    data = models.get("data") or [{}]
    name = data[0].get("id") if isinstance(data, list) and data else None
    say(f"  the proxy serves the model {name!r}; POST /v1/chat/completions")
    body = {
        "model": name,
        "messages": [{"role": "user", "content": "What is 1 + 1?"}],
        "max_tokens": 6,
    }
    asked = time.monotonic()
    result["response"] = _http(f"{url}/v1/chat/completions", body, timeout=300)
    result["answer_s"] = round(time.monotonic() - asked, 1)
    say(f"  answered in {result['answer_s']} s: {json.dumps(result['response'])[:400]}")
    return result


#: What `ray start --head` says when its own raylet missed Ray's fixed 30 s registration (a loaded machine).
_START_TIMEOUT = "The current node timed out during startup"


def retrying_start(call: Callable[[], _T], tries: int = 3, say: Callable[[str], None] = print) -> _T:
    """``call()``, again (up to ``tries`` times) when the cluster's head failed to start under load."""
    for attempt in range(1, tries + 1):
        try:
            return call()
        except RuntimeError as exc:
            if _START_TIMEOUT not in str(exc) or attempt == tries:
                raise
            say(
                f"the Ray head's raylet timed out at startup (machine loaded): starting again ({attempt}/{tries})"
            )
            time.sleep(10)
    raise AssertionError("unreachable")
