r"""Normalisations written out in ordinary ops while the probe differentiates forward over forward.

The probe's second derivative F″(0) = vᵀ∇²F v is a forward-mode derivative of a forward-mode derivative
(``terms.derivatives``). torch 2.13's fused normalisation kernels get that wrong wherever they normalise by
the statistics of their input: on x of shape 4 × 8 in float64, vᵀ∇²(w·f(x))v for f = ``layer_norm`` came out
−20.91 against −9.20 by central differences, and −12.72 against −9.01 without affine parameters; for
``batch_norm`` on the batch's statistics 40.85 against 27.58, and ``instance_norm`` (which runs through it)
7.67 against 3.78. Their first derivatives, and reverse mode (the curvature's Hessian-vector products), are
right; ``group_norm``, ``rms_norm`` and a batch norm on running statistics (an affine map) are right too.

Within ``composed_norms()`` ``torch.nn.functional.layer_norm``, ``batch_norm`` and ``instance_norm`` compute

    y = (x − mean) / √(var + ε) · weight + bias

(mean and biased variance over the normalised dimensions) from ordinary ops, whose nested forward-mode
derivatives are exact (tested against central differences). ``nn.LayerNorm``, ``nn.BatchNorm*`` and
``nn.InstanceNorm*`` call these functions, so every model built from them is covered; a model that calls
``torch.layer_norm`` itself, or bound the function under another name before the block, is not.

``F.embedding`` with ``max_norm`` (``nn.Embedding(max_norm=…)``) rescales each row e it looks up whose norm
exceeds max_norm, in place and without a derivative: the probe's derivatives missed the rescaling (on a tiny LM
H′ came out 7.8 times the central difference) and its forward passes rescaled the weight given. Within the block
it looks up the rows of

    e · min(1, max_norm / (‖e‖ + 10⁻⁷))        (torch's factor, applied where ‖e‖ > max_norm)

computed out of place, which is the function of the weight a single lookup is; ``F.embedding_bag``'s ``max_norm``
(``nn.EmbeddingBag``) likewise. An embedding whose weight another module holds too (an output head tied to it) is
refused (``check_max_norms_untied``): torch's forward pass rescales the rows the whole batch looks up before the
head reads them, so a sequence's logits depend on the other sequences and on its own later tokens. A forward pass
that reads the embedding's weight outside the embedding without another module holding it is not detected.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

NAMES = ("layer_norm", "batch_norm", "instance_norm", "embedding", "embedding_bag")


@contextlib.contextmanager
def composed_norms() -> Iterator[None]:
    """``F.layer_norm``, ``F.batch_norm``, ``F.instance_norm``, and ``F.embedding``'s and ``F.embedding_bag``'s
    ``max_norm``, from ordinary ops for the duration."""
    originals = {name: getattr(F, name) for name in NAMES}
    composed = {
        "layer_norm": _layer_norm,
        "batch_norm": _batch_norm(originals["batch_norm"]),
        "instance_norm": _instance_norm(originals["instance_norm"]),
        "embedding": _embedding(originals["embedding"]),
        "embedding_bag": _embedding_bag(originals["embedding_bag"]),
    }
    for name in NAMES:
        setattr(F, name, composed[name])
    try:
        yield
    finally:
        for name, function in originals.items():
            setattr(F, name, function)


def normalised(x: Tensor, dims: Sequence[int], weight: Tensor | None, bias: Tensor | None, eps: float) -> Tensor:
    """(x − mean) / √(var + ε) over ``dims`` (biased variance), then · weight + bias (shaped to broadcast)."""
    mean = x.mean(dim=tuple(dims), keepdim=True)
    centred = x - mean
    out = centred * torch.rsqrt(centred.square().mean(dim=tuple(dims), keepdim=True) + eps)
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out


def _channel(t: Tensor | None, x: Tensor) -> Tensor | None:
    """A per-channel tensor shaped [1, C, 1, …] to broadcast over ``x`` of shape [N, C, …]."""
    return None if t is None else t.reshape(1, -1, *([1] * (x.ndim - 2)))


def _layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    dims = range(-len(tuple(normalized_shape)), 0)
    return normalised(x, dims, weight, bias, eps)


def _batch_norm(original):
    def batch_norm(x, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
        if not training or running_mean is not None or running_var is not None:
            # running statistics: an affine map (right as it is), or ones to update (a module in training
            # mode, which the probe never runs): torch's own
            return original(x, running_mean, running_var, weight, bias, training, momentum, eps)
        dims = [0, *range(2, x.ndim)]
        return normalised(x, dims, _channel(weight, x), _channel(bias, x), eps)

    return batch_norm


def _instance_norm(original):
    def instance_norm(
        x, running_mean=None, running_var=None, weight=None, bias=None, use_input_stats=True, momentum=0.1, eps=1e-5
    ):
        if not use_input_stats or running_mean is not None or running_var is not None:
            return original(x, running_mean, running_var, weight, bias, use_input_stats, momentum, eps)
        return normalised(x, range(2, x.ndim), _channel(weight, x), _channel(bias, x), eps)

    return instance_norm


def renormalised_rows(weight: Tensor, max_norm: float | None, norm_type: float) -> Tensor:
    """``weight`` with every row whose norm exceeds ``max_norm`` rescaled by torch's factor, out of place (module
    doc); ``weight`` itself without ``max_norm``."""
    if max_norm is None:
        return weight
    norms = torch.linalg.vector_norm(weight, ord=norm_type, dim=-1, keepdim=True)
    return torch.where(norms > max_norm, weight * (max_norm / (norms + 1e-7)), weight)


def _embedding(original):
    def embedding(x, weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False, sparse=False):
        weight = renormalised_rows(weight, max_norm, norm_type)
        return original(x, weight, padding_idx, None, norm_type, scale_grad_by_freq, sparse)

    return embedding


def _embedding_bag(original):
    def embedding_bag(x, weight, offsets=None, max_norm=None, norm_type=2, *args, **kwargs):
        weight = renormalised_rows(weight, max_norm, norm_type)
        return original(x, weight, offsets, None, norm_type, *args, **kwargs)

    return embedding_bag


def check_max_norms_untied(model: nn.Module, who: str) -> None:
    """A one-line error for an embedding with ``max_norm`` whose weight another module holds too (module doc)."""
    holders: dict[int, list[tuple[nn.Module, str]]] = {}
    for prefix, module in model.named_modules(remove_duplicate=False):
        for name, p in module.named_parameters(prefix=prefix, recurse=False):
            holders.setdefault(id(p), []).append((module, name))
    for module in model.modules():
        if isinstance(module, nn.Embedding | nn.EmbeddingBag) and module.max_norm is not None:
            held = holders[id(module.weight)]
            others = [name for m, name in held if m is not module]
            if others:
                mine = next(name for m, name in held if m is module)
                raise ValueError(
                    f"{who}: {mine}, the weight of an {type(module).__name__} with max_norm={module.max_norm}, is "
                    f"also {others[0]}: torch rescales the rows a batch looks up in place before {others[0]} reads "
                    "them, so a sequence's logits depend on the whole batch; untie them, or set max_norm=None"
                )
