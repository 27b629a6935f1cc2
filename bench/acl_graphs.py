"""The rollout's tokens per second on the simulated Ascend: ACL graph mode against eager, real vllm-ascend.

Run in a stack with vLLM 0.18 and the real vllm-ascend 0.18.0 laid out (stack c:
``.nox/stack-c/bin/python bench/acl_graphs.py [rounds]``).

One engine per mode on the tiny Qwen2 of ``tests/e2e/tiny_model.py``, each in its own simulated-Ascend process
(TP 1): eager (``enforce_eager=True``), and graph mode at Trinity's rollout default (``enforce_eager=False``,
which vllm-ascend runs as PIECEWISE ACL graphs) twice: with the worker in the engine's process (each piece
compiled by inductor, npugraph_ex off) and in a process of its own (vLLM's mp executor: each piece through
torchair's npugraph_ex, run eagerly, as in Trinity's TP 2 workers).  Each generates a batch of 16 prompts,
64 greedy tokens each, ``rounds`` times after a warm-up; the median tokens per second of each mode and their
ratio to eager are printed, and whether the modes generated the same tokens.
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


def run(eager: bool, rounds: int, vllm_ascend: str = "real", executor: str = "uni") -> dict[str, list[float]]:
    """One engine in its own simulated-Ascend process, on ``vllm_ascend`` (``real`` or ``stand-in``), its
    worker in the engine's process (``uni``) or one of its own (``mp``)."""
    env = simulation_env(1, vllm_ascend=vllm_ascend)
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
        raise SystemExit(f"the {mode} engine on the {vllm_ascend} vllm-ascend failed:\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1])  # type: ignore[no-any-return]


def rounds_on_stack_c() -> int:
    """The rounds asked for (default 5), once this is a stack with vLLM 0.18 and vllm-ascend 0.18.0; the
    engines are simulated hosts of their own, not this process."""
    vllm = _sites.installed_vllm()
    if vllm is None or _sites.vllm_ascend_release(vllm) != "0.18.0":
        raise SystemExit("needs vLLM 0.18 and the real vllm-ascend 0.18.0 laid out (stack c)")
    os.environ.pop("NPU_COMPAT_SIMULATE", None)
    return int(sys.argv[1]) if len(sys.argv) > 1 else 5


def main() -> None:
    rounds = rounds_on_stack_c()
    eager, inductor, npugraph_ex = run(True, rounds), run(False, rounds), run(False, rounds, executor="mp")
    e = statistics.median(eager["rates"])
    print(f"eager:                           {e:8.1f} tokens/s (median of {rounds})")
    for label, graph in (("inductor pieces", inductor), ("npugraph_ex pieces", npugraph_ex)):
        g = statistics.median(graph["rates"])
        print(
            f"ACL graphs, {label + ':':21s}{g:8.1f} tokens/s, {g / e:.2f} x eager (no floor: the docstring)"
        )
    print(f"same tokens: {eager['tokens'] == inductor['tokens'] == npugraph_ex['tokens']}")


if __name__ == "__main__":
    main()
