"""A training step on the simulated Ascend's ``npu`` against the same step on CPU, side by side.

Run in an environment with torch and transformers (a stack venv):
``python bench/sim_compute.py [steps]``.

For the tiny Qwen2 of ``tests/e2e/tiny_model.py`` (hidden size 32, one layer) and one 10x
its parameters, one training step (forward, loss, backward, AdamW) runs on CPU and on
``npu:0`` in turn, interleaved, same weights and batch; the median step time of each and
their ratio are printed.  Goal: ratio <= 1.5.  Then the operators the CPU fallback served
in one ``npu`` step, with counts (everything but allocation, copies and views).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from npu_compat.testing import enable  # noqa: E402

enable(2)

import torch  # noqa: E402
from transformers import Qwen2Config, Qwen2ForCausalLM  # noqa: E402

from npu_compat.testing import _torch_sim  # noqa: E402

SIZES = {
    # the tiny model of tests/e2e/tiny_model.py (its vocabulary is at least 64 words)
    "tiny (e2e)": dict(hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1),
    "10x": dict(hidden_size=96, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2),
}


def model(size: dict[str, int]) -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=64, num_hidden_layers=1, max_position_embeddings=512, tie_word_embeddings=True,
        attn_implementation="eager", **size,
    )  # fmt: skip
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config)


def stepper(net: Qwen2ForCausalLM, device: str) -> Any:
    net = net.to(device)
    optim = torch.optim.AdamW(net.parameters(), lr=1e-3, foreach=False)
    ids = torch.randint(4, 64, (4, 32), generator=torch.Generator().manual_seed(1)).to(device)

    def step() -> float:
        start = time.perf_counter()
        loss = net(input_ids=ids, labels=ids).loss
        loss.backward()
        optim.step()
        optim.zero_grad()
        loss.item()
        return time.perf_counter() - start

    return step


def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    native = _torch_sim.NATIVE
    if native is None:
        sys.exit(f"the simulated npu backend is not loaded: {_torch_sim._npu_backend.failure()}")
    torch.set_num_threads(1)  # the same thread count on both sides; a loaded host stays comparable
    print(f"{'model':<12} {'params':>8} {'cpu ms':>8} {'npu ms':>8} {'ratio':>6}")
    counts: dict[str, int] = {}
    for name, size in SIZES.items():
        base = model(size)
        params = sum(p.numel() for p in base.parameters())
        cpu, npu = stepper(model(size), "cpu"), stepper(base, "npu:0")
        for _ in range(3):  # warm up both
            cpu(), npu()
        times: dict[str, list[float]] = {"cpu": [], "npu": []}
        for _ in range(steps):
            times["cpu"].append(cpu())
            times["npu"].append(npu())
        c, n = statistics.median(times["cpu"]), statistics.median(times["npu"])
        print(f"{name:<12} {params:>8} {c * 1e3:>8.2f} {n * 1e3:>8.2f} {n / c:>6.2f}")
        if not counts:
            native.set_fallback_counting(True)
            npu()
            native.set_fallback_counting(False)
            counts = dict(native.fallback_counts())
    print(f"\nthe CPU fallback in one npu step of the tiny model: {sum(counts.values())} calls")
    for op, n in sorted(counts.items(), key=lambda kv: -kv[1]):
        print(f"  {n:>4}  {op}")


if __name__ == "__main__":
    main()
