"""A tiny Qwen2 model and tokenizer made locally at run time: random weights, nothing downloaded.

Test harness for the end-to-end scenario, never part of ``npu_compat``.
``python -m tests.e2e.tiny_model DIR`` writes a Hugging Face model directory to ``DIR``.
"""

from __future__ import annotations

import sys
from pathlib import Path

#: Sentences the word-level vocabulary is built from (plus the digits the dataset uses).
CORPUS = [
    "what is one plus one ? the answer is two .",
    "what is two plus two ? the answer is four .",
    "please reason step by step and put the final answer in a box .",
    "you are a helpful assistant . user assistant system",
    " ".join(str(d) for d in range(10)) + " + - * / = ( ) { } \\boxed",
]
SPECIALS = ["<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def make_tokenizer(directory: Path) -> int:
    """A word-level PreTrainedTokenizerFast with a chat template; returns its vocabulary size."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Digits(True)]
    )
    tok.train_from_iterator(CORPUS, trainers.WordLevelTrainer(special_tokens=SPECIALS))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(directory)
    return int(tok.get_vocab_size())


def make_tiny_model(
    directory: Path | str,
    *,
    heads: int = 2,
    kv_heads: int = 1,
    initializer_range: float = 0.02,
    arch: str = "qwen2",
) -> Path:
    """Write a 1-layer Qwen2 or Llama (hidden size 32) with random weights and its tokenizer to ``directory``.

    ``heads``/``kv_heads``: its attention heads; ``initializer_range``: the spread of its random weights
    (with the default, greedy decoding mostly repeats a token; 0.5 gives varied answers); ``arch="llama"``:
    the same shape as a Llama (no bias on the attention's projections, its own model class in vLLM)."""
    import torch
    from transformers import (
        GenerationConfig,
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    kinds = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM)}
    config_class, model_class = kinds[arch]

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    vocab = make_tokenizer(directory)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(directory)
    config = config_class(
        vocab_size=max(64, vocab),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        initializer_range=initializer_range,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        torch_dtype="float32",
        architectures=[model_class.__name__],
    )
    torch.manual_seed(0)
    model = model_class(config)
    model.save_pretrained(directory)
    GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    ).save_pretrained(directory)
    return directory


if __name__ == "__main__":  # DIRECTORY [INITIALIZER_RANGE]
    print(make_tiny_model(sys.argv[1], initializer_range=float(sys.argv[2]) if len(sys.argv) > 2 else 0.02))
