"""Trinity's rollout as Trinity's own code drives it, outside a whole run: a Ray driver of the test.

It builds the rollout engines of a Trinity config as the Explorer builds them (0.6: ``Allocator(config.explorer)
.create_all_models()``; 0.5: ``create_explorer_models``, each engine's ``prepare`` and a ``ModelWrapper``), then
calls, on every engine, what Trinity's workflows call on ``ModelWrapper``: ``generate``, ``chat``, ``logprobs``
(the prompt logprobs through Trinity's own vLLM patch), ``convert_messages_to_experience``, and the OpenAI API
server through the wrapper's sync and async clients.  It writes what each returned to a JSON file::

    python -m npu_compat python -m tests.e2e.rollout_driver CONFIG OUT_JSON

Run on a Ray cluster (``RAY_ADDRESS``), by ``tests/e2e/test_trinity_rollout.py``.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import ray

PROMPT = "What is 1 + 1?"
MESSAGES = [{"role": "user", "content": PROMPT}]
#: greedy, and past the end-of-text token: every call generates its whole length on any weights
GREEDY = {"temperature": 0.0, "max_tokens": 8, "ignore_eos": True}


async def _wrappers(config: Any) -> list[Any]:
    """The rollout engines' ``ModelWrapper``s, as Trinity's Explorer and workflow runners build them."""
    try:
        from trinity.common.models.allocator import Allocator  # Trinity 0.6
    except ImportError:  # 0.5
        from trinity.common.models import create_explorer_models
        from trinity.common.models.model import ModelWrapper

        engines, _ = create_explorer_models(config)
        await asyncio.gather(*[engine.prepare.remote() for engine in engines])  # the Explorer's prepare
        wrappers = [ModelWrapper(engine, enable_history=True) for engine in engines]
        await asyncio.gather(*[wrapper.prepare() for wrapper in wrappers])
        return wrappers
    rollout, _auxiliary = await Allocator(config.explorer).create_all_models()
    return list(rollout)


def _experience(exp: Any) -> dict[str, Any]:
    return {
        "tokens": exp.tokens.tolist(),
        "prompt_length": int(exp.prompt_length),
        "logprobs": exp.logprobs.tolist() if exp.logprobs is not None else None,
    }


async def _drive(wrapper: Any) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    (generated,) = await wrapper.generate_async([PROMPT], **GREEDY)
    seen["generate"] = _experience(generated)
    (chatted,) = await wrapper.chat_async(MESSAGES, **GREEDY)
    seen["chat"] = _experience(chatted)
    tokens = chatted.tokens.tolist()
    seen["logprobs"] = (await wrapper.logprobs_async(tokens)).tolist()
    seen["logprobs_t2"] = (await wrapper.logprobs_async(tokens, temperature=2.0)).tolist()
    answer = {"role": "assistant", "content": chatted.response_text}
    converted = await wrapper.convert_messages_to_experience_async([*MESSAGES, answer])
    seen["converted"] = _experience(converted)
    seen["answer"] = chatted.response_text
    wrapper.history.clear()
    client = wrapper.get_openai_client()
    response = client.chat.completions.create(
        model=client.model_path,
        messages=MESSAGES,
        temperature=0.0,
        max_tokens=8,
        extra_body={"ignore_eos": True},
    )
    seen["openai"] = {"text": response.choices[0].message.content, "history": _history(wrapper)}
    async_client = wrapper.get_openai_async_client()
    response = await async_client.chat.completions.create(
        model=async_client.model_path, messages=MESSAGES, temperature=0.0, max_tokens=8,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    seen["openai_async"] = {"text": response.choices[0].message.content, "history": _history(wrapper)}
    return seen


def _history(wrapper: Any) -> list[dict[str, Any]]:
    """What the wrapper recorded of its OpenAI calls since the last read (``enable_history``)."""
    recorded = [_experience(exp) for exp in wrapper.history]
    wrapper.history.clear()
    return recorded


async def _main(config_path: str) -> dict[str, Any]:
    from trinity.common.config import load_config

    config = load_config(config_path)
    config.check_and_update()  # then Ray, as ``trinity run`` (``run_stage``) starts it
    ray.init(
        address=config.cluster.ray_address, ignore_reinit_error=True, namespace=config.ray_namespace,
        runtime_env={"env_vars": config.get_envs()},
    )  # fmt: skip
    wrappers = await _wrappers(config)
    engines = [await _drive(wrapper) for wrapper in wrappers]
    return {"engines": engines}


def main() -> None:
    config_path, out = sys.argv[1:3]
    seen = asyncio.run(_main(config_path))
    with open(out, "w") as f:
        json.dump(seen, f)
    print(f"rollout driver: {len(seen['engines'])} engines driven, results in {out}")


if __name__ == "__main__":
    main()
