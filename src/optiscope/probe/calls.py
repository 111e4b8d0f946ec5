"""How the probe calls a model: token ids in, next-token logits out — for a plain module returning logits
(or a tuple whose first element they are) and for any 🤗 causal LM (a ``ModelOutput`` with ``.logits``,
padded batches through ``attention_mask``, a PEFT wrapper around it).

A padded batch is called with its attention mask and position ids that count real tokens only
(``cumsum(mask) − 1``), so a left-padded sequence sees the same positions as the sequence alone; with
causal attention, right padding changes nothing before it either. The probe's forward-mode derivatives
need an attention implementation with forward-mode (JVP) rules: the fused kernels behind
``F.scaled_dot_product_attention`` (flash, memory-efficient) and the inference fast path of
``nn.MultiheadAttention`` / ``nn.TransformerEncoderLayer`` have none; the math backend (matmul, softmax), the
modules' ordinary path and 🤗's ``eager`` attention have. ``forward_mode_attention`` selects those for the
measurement only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

#: the attention implementation the probe measures 🤗 models with (forward-mode AD rules for every op)
FORWARD_MODE_ATTENTION = "eager"


def is_transformers_model(model: nn.Module) -> bool:
    """A 🤗 ``PreTrainedModel`` (or a PEFT model around one, which forwards these attributes to it)."""
    return hasattr(model, "set_attn_implementation") and hasattr(getattr(model, "config", None), "use_cache")


def logits_of(output: Any) -> Any:
    """The logits in a model's output: ``.logits`` of a 🤗 output, the first element of a tuple, or the output."""
    logits = getattr(output, "logits", None)
    if logits is not None:
        return logits
    if isinstance(output, tuple | list):
        return output[0]
    return output


def call_kwargs(model: nn.Module, attention_mask: Tensor | None) -> dict[str, Any]:
    """Keyword arguments of a forward pass on (a chunk of) the inputs: none for a plain module; for a 🤗
    model no key/value cache, and with padding its attention mask and position ids over real tokens."""
    if not is_transformers_model(model):
        if attention_mask is not None:
            raise ValueError(
                f"attention_mask is given but {type(model).__name__} is not a 🤗 model taking attention_mask and "
                "position_ids; give unpadded sequences"
            )
        return {}
    kwargs: dict[str, Any] = {"use_cache": False}
    if attention_mask is not None:
        kwargs["attention_mask"] = attention_mask
        kwargs["position_ids"] = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    return kwargs


@contextlib.contextmanager
def forward_mode_attention(model: nn.Module) -> Iterator[None]:
    """Within the block ``F.scaled_dot_product_attention`` runs its math backend (the same attention, in plain ops),
    ``nn.MultiheadAttention`` and ``nn.Transformer*Layer`` their ordinary path, and a 🤗 model ``eager`` attention;
    each setting is restored after."""
    with sdpa_kernel(SDPBackend.MATH), native_attention_off(), huggingface_eager_attention(model):
        yield


@contextlib.contextmanager
def native_attention_off() -> Iterator[None]:
    """torch's fused inference path for ``nn.MultiheadAttention`` and the transformer layers off for the duration
    (a global flag, put back as it was)."""
    enabled = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(enabled)


@contextlib.contextmanager
def huggingface_eager_attention(model: nn.Module) -> Iterator[None]:
    """Within the block a 🤗 model uses ``eager`` attention; its own implementation is restored after."""
    current = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if not is_transformers_model(model) or current in (None, FORWARD_MODE_ATTENTION):
        yield
        return
    model.set_attn_implementation(FORWARD_MODE_ATTENTION)
    try:
        yield
    finally:
        model.set_attn_implementation(current)
