"""The rollout's tokens per second on the simulated Ascend: ACL graph mode against eager, real vllm-ascend.

Run in a stack with the real vllm-ascend laid out: ``.nox/stack-c/bin/python bench/acl_graphs.py [rounds]``
(vLLM 0.18, vllm-ascend 0.18.0) or ``.nox/stack-a/bin/python ...`` (vLLM 0.23, vllm-ascend 0.23.0.post1).

One engine per mode on the tiny Qwen2 of ``tests/e2e/tiny_model.py``, each in its own simulated-Ascend process
(TP 1): eager (``enforce_eager=True``), and graph mode at Trinity's rollout default (``enforce_eager=False``)
twice: with the worker in the engine's process and in a process of its own (vLLM's mp executor, as in
Trinity's TP 2 workers).  0.18.0 runs graph mode as PIECEWISE ACL graphs, each piece compiled by inductor in
the engine's process and through torchair's npugraph_ex (run eagerly) in a worker of its own; 0.23.0.post1
captures PIECEWISE graphs and FULL decode graphs (attention as task groups updated each step), npugraph_ex
off in both.  Each generates a batch of 16 prompts, 64 greedy tokens each, ``rounds`` times after a
warm-up; the median tokens per second of each mode and their ratio to eager are printed, and whether the
modes generated the same tokens.
No floor: on the device graphs save the host's launch time, which a simulated device does not have (each
replay reruns the captured operators in Python).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from npu_compat.testing import _sites  # noqa: E402
from npu_compat.testing._host import simulation_env  # noqa: E402

ENGINE = """
import json, os, sys, tempfile, time
sys.path.insert(0, os.environ["BENCH_REPO"])
from tests.e2e.tiny_model import make_tiny_model

def main():
    tiny = make_tiny_model(os.path.join(tempfile.mkdtemp(), "tiny"), initializer_range=0.5)
    from vllm import LLM, SamplingParams
    llm = LLM(model=str(tiny), enforce_eager=os.environ["BENCH_EAGER"] == "1", dtype="float32",
              max_model_len=256, seed=0, gpu_memory_utilization=0.05,
              distributed_executor_backend=os.environ["BENCH_EXECUTOR"])
    prompts = [{"prompt_token_ids": [4 + (i * 7 + j) % 50 for j in range(8)]} for i in range(16)]
    greedy = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    llm.generate(prompts, greedy, use_tqdm=False)  # warm-up
    rates, tokens = [], None
    for _ in range(int(os.environ["BENCH_ROUNDS"])):
        start = time.perf_counter()
        out = llm.generate(prompts, greedy, use_tqdm=False)
        elapsed = time.perf_counter() - start
        tokens = [list(r.outputs[0].token_ids) for r in out]
        rates.append(sum(len(t) for t in tokens) / elapsed)
    print(json.dumps({"rates": rates, "tokens": tokens}))

if __name__ == "__main__":
    main()
"""


def run(eager: bool, rounds: int, executor: str = "uni") -> dict[str, list[float]]:
    """One engine in its own simulated-Ascend process on the released vllm-ascend, its worker in the engine's
    process (``uni``) or one of its own (``mp``)."""
    env = simulation_env(1)
    env.update(
        BENCH_REPO=str(REPO), BENCH_EAGER="1" if eager else "0", BENCH_ROUNDS=str(rounds),
        BENCH_EXECUTOR=executor, VLLM_ASCEND_ENABLE_NZ="0", VLLM_WORKER_MULTIPROC_METHOD="spawn",
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as cwd:
        proc = subprocess.run(
            [sys.executable, "-c", ENGINE], env=env, cwd=cwd, capture_output=True, text=True, check=False
        )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode or not lines:
        mode = "eager" if eager else "graph"
        raise SystemExit(f"the {mode} engine failed:\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1])  # type: ignore[no-any-return]


def release_and_rounds() -> tuple[str, int]:
    """The laid-out vllm-ascend release of this stack, and the rounds asked for (default 5); the engines are
    simulated hosts of their own, not this process."""
    vllm = _sites.installed_vllm()
    release = _sites.vllm_ascend_release(vllm) if vllm is not None else None
    if release not in ("0.18.0", "0.23.0.post1"):
        raise SystemExit("needs vLLM 0.18 or 0.23 and the real vllm-ascend laid out (stack c or a)")
    os.environ.pop("NPU_COMPAT_SIMULATE", None)
    return release, int(sys.argv[1]) if len(sys.argv) > 1 else 5


def main() -> None:
    release, rounds = release_and_rounds()
    eager, here, own = run(True, rounds), run(False, rounds), run(False, rounds, executor="mp")
    e = statistics.median(eager["rates"])
    print(f"vllm-ascend {release}")
    print(f"eager:                                     {e:8.1f} tokens/s (median of {rounds})")
    if release == "0.18.0":
        labels = ("PIECEWISE, inductor pieces", "PIECEWISE, npugraph_ex pieces")
    else:
        labels = ("FULL_AND_PIECEWISE, engine's process", "FULL_AND_PIECEWISE, worker of its own")
    for label, graph in zip(labels, (here, own), strict=True):
        g = statistics.median(graph["rates"])
        print(
            f"ACL graphs, {label + ':':31s}{g:8.1f} tokens/s, {g / e:.2f} x eager (no floor: the docstring)"
        )
    print(f"same tokens: {eager['tokens'] == here['tokens'] == own['tokens']}")


if __name__ == "__main__":
    main()
