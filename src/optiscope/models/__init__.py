"""Models the experiments train and the probe measures: ``gpt`` (a small causal transformer LM)."""

from .gpt import GPT, GPTConfig

__all__ = ["GPT", "GPTConfig"]
