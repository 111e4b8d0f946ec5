"""🤗 causal language models from a local directory, optionally with LoRA adapters (``pip install 'optiscope[hf]'``).

``load_causal_lm(directory)`` reads the model and its tokenizer with ``from_pretrained`` from files
only (no hub); ``add_lora(model, rank)`` wraps it with PEFT LoRA adapters on every linear layer but
the output head, α = 2r and no dropout, so that only the adapters train (seed 001's setting: LoRA on a
pretrained causal LM). transformers and peft are imported here, when called, never by ``import optiscope``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn


def load_causal_lm(directory: Path | str, quiet: bool = False) -> tuple[nn.Module, Any]:
    """(model, tokenizer) from a local ``from_pretrained`` directory; the model in training mode. ``quiet``:
    without 🤗's loading progress bars (its setting is restored after)."""
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging
    except ImportError as e:
        raise ImportError("a 🤗 model needs transformers: pip install 'optiscope[hf]'") from e
    bars = hf_logging.is_progress_bar_enabled()
    if quiet:
        hf_logging.disable_progress_bar()
    try:
        model = AutoModelForCausalLM.from_pretrained(directory, local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    return model.train(), tokenizer


def add_lora(model: nn.Module, rank: int) -> nn.Module:
    """``model`` with LoRA adapters of ``rank`` on all its linear layers except the output head; the
    original weights are frozen (``requires_grad=False``) and stay bit-for-bit as they were."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as e:
        raise ImportError("LoRA adapters need peft: pip install 'optiscope[hf]'") from e
    config = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules="all-linear")
    return get_peft_model(model, config)


def context_length(model: nn.Module) -> int | None:
    """The longest sequence the model's position embeddings cover, when its config says so."""
    config = getattr(model, "config", None)
    for key in ("max_position_embeddings", "n_positions"):
        value = getattr(config, key, None)
        if isinstance(value, int):
            return value
    return None
