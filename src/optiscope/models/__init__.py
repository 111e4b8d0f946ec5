"""Models the experiments train and the probe measures: ``gpt`` (a small causal transformer LM),
``adder`` (the tiny transformer family that adds ten-digit numbers) and ``adder_challenge`` (the
challenge's ``build_model``/``add`` interface, greedy decoding and the suite report)."""

from .gpt import GPT, GPTConfig

__all__ = ["GPT", "GPTConfig"]
