"""Tiny randomly initialised 🤗 causal LMs and a character-level tokenizer, built offline from configs."""

from __future__ import annotations

import string
from pathlib import Path

import torch

VOCAB = 128
SPECIALS = ["<unk>", "<pad>", "<eos>"]
SPECIAL_IDS = {"pad_token_id": 1, "bos_token_id": 2, "eos_token_id": 2}


def tokenizer():
    """A character-level ``PreTrainedTokenizerFast``: printable ASCII, newline and three special tokens."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = SPECIALS + list(string.printable)
    vocab = {c: i for i, c in enumerate(dict.fromkeys(chars))}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", pad_token="<pad>", eos_token="<eos>")


def config(kind: str):
    from transformers import GPT2Config, Qwen2Config

    if kind == "gpt2":
        return GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=16, n_layer=1, n_head=2, **SPECIAL_IDS)
    if kind == "qwen2":
        return Qwen2Config(
            vocab_size=VOCAB,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=64,
            **SPECIAL_IDS,
            tie_word_embeddings=False,
        )
    raise ValueError(kind)


def model(kind: str, seed: int = 0):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config(kind))


def save(kind: str, directory: Path, seed: int = 0) -> Path:
    """A ``from_pretrained`` directory holding a tiny model of ``kind`` and the tokenizer."""
    model(kind, seed).save_pretrained(directory)
    tokenizer().save_pretrained(directory)
    return directory
