"""Write the tiny model, tokenizer and prompts the VeRL run trains on, all made here.

No hub download: a byte-level BPE tokenizer trained on the prompts themselves (chat template in
the ChatML layout VeRL's Qwen recipes use), a randomly initialised Qwen2 causal LM (head_dim 64,
the smallest head size vLLM's CPU attention takes) and train/validation parquet files of
arithmetic prompts in VeRL's RL dataset layout (``data_source`` ``openai/gsm8k``, so VeRL's own
rule reward scores them: ``#### <answer>``). Deterministic for a given seed::

    python -m checks.verl_run.build_assets --out verl_run_assets
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
DATA_SOURCE = "openai/gsm8k"


@dataclass(frozen=True)
class AssetSizes:
    """How big the model and data are."""

    vocab_size: int = 512
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 2  # head_dim = hidden_size / num_heads = 64
    num_kv_heads: int = 1
    intermediate_size: int = 256
    max_positions: int = 1024
    train_prompts: int = 64
    val_prompts: int = 8
    seed: int = 0


def prompts(count: int, seed: int) -> list[tuple[str, str]]:
    """``count`` (question, answer) pairs of two-number sums, the same for a given seed."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(count):
        a, b = rng.randint(1, 99), rng.randint(1, 99)
        question = (
            f"What is {a} plus {b}? Think step by step, then give the final answer after '####'."
        )
        pairs.append((question, str(a + b)))
    return pairs


def build_tokenizer(out: Path, corpus: list[str], vocab_size: int) -> Any:
    """Train a byte-level BPE on ``corpus``; save it (with the chat template) under ``out``."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        corpus, vocab_size=vocab_size, min_frequency=1, special_tokens=list(SPECIAL_TOKENS)
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe._tokenizer,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(out)
    return tokenizer


def build_model(out: Path, tokenizer: Any, sizes: AssetSizes) -> int:
    """A random Qwen2 causal LM sized by ``sizes``, saved (safetensors) under ``out``.

    Returns its parameter count.
    """
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(sizes.seed)
    settings: dict[str, Any] = dict(
        vocab_size=len(tokenizer),
        hidden_size=sizes.hidden_size,
        intermediate_size=sizes.intermediate_size,
        num_hidden_layers=sizes.num_layers,
        num_attention_heads=sizes.num_heads,
        num_key_value_heads=sizes.num_kv_heads,
        head_dim=sizes.hidden_size // sizes.num_heads,
        max_position_embeddings=sizes.max_positions,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = Qwen2ForCausalLM(Qwen2Config(**settings))  # float32
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    model.save_pretrained(out, safe_serialization=True)
    return sum(p.numel() for p in model.parameters())


def dataset_rows(pairs: list[tuple[str, str]], split: str) -> list[dict[str, Any]]:
    """VeRL's RL dataset rows (``prompt`` as chat messages, rule-based reward)."""
    return [
        {
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": question}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": answer},
            "extra_info": {"split": split, "index": index},
        }
        for index, (question, answer) in enumerate(pairs)
    ]


def build(out: Path, sizes: AssetSizes = AssetSizes()) -> dict[str, Any]:
    """Model, tokenizer and data under ``out`` (``model/``, ``data/{train,val}.parquet``).

    Returns what was built (also written to ``out/assets.json``).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    train = prompts(sizes.train_prompts, sizes.seed)
    val = prompts(sizes.val_prompts, sizes.seed + 1)
    corpus = [f"{q} {a} #### {a}" for q, a in train + val] * 4 + [
        "<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\n"
    ]
    model_dir, data_dir = out / "model", out / "data"
    model_dir.mkdir(parents=True, exist_ok=True)
    data_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(model_dir, corpus, sizes.vocab_size)
    n_params = build_model(model_dir, tokenizer, sizes)
    for split, pairs in (("train", train), ("val", val)):
        pq.write_table(
            pa.Table.from_pylist(dataset_rows(pairs, split)), data_dir / f"{split}.parquet"
        )
    built = {
        "model": str(model_dir),
        "train": str(data_dir / "train.parquet"),
        "val": str(data_dir / "val.parquet"),
        "vocab_size": len(tokenizer),
        "parameters": n_params,
        "train_prompts": len(train),
        "val_prompts": len(val),
    }
    (out / "assets.json").write_text(json.dumps(built, indent=2) + "\n", encoding="utf-8")
    return built


def main(argv: list[str] | None = None) -> None:
    """Command line: ``--out DIR`` (default ``verl_run_assets``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("verl_run_assets"))
    args = parser.parse_args(argv)
    print(json.dumps(build(args.out), indent=2))


if __name__ == "__main__":
    main()
