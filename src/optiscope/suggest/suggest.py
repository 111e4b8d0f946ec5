"""``suggest_lr``: a learning rate before the sweep, read from the optimizer's own stability threshold."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from torch import Tensor, nn

from ..checks import is_count, non_negative
from ..errors import SuggestionError
from .methods import DEFAULT_METHOD, FALLBACK, METHODS
from .session import OptimizerSpec, Session, untouched
from .suggestion import LRSuggestion


def suggest_lr(
    model: nn.Module,
    optimizer: OptimizerSpec,
    loss_fn: Callable[[nn.Module, Any], Tensor],
    batches: Iterable[Any],
    *,
    steps: int = 100,
    method: str = DEFAULT_METHOD,
    weight_decay: float = 0.0,
    decay_vectors: bool = True,
) -> LRSuggestion:
    r"""A learning rate for ``optimizer`` on ``model``, from a short probe on a copy of it, before any training.

    The probe measures the curvature λ the optimizer's stability threshold bounds — λ₁(H) for SGD, λ₁(P⁻¹H) for
    Adam-family optimizers, P = diag(√v̂ + ε) — and puts η at a factor σ of the edge η_edge = c/λ, where the
    threshold c/η is the optimizer's own ([`stability_threshold`][optiscope.curvature.stability_threshold]: 2/η for
    gradient descent, (2 + 2β)/η with heavy-ball momentum, 38/η for Adam at β₁ = 0.9):

        η = σ · c / λ

    By default (``method="limits"``) λ is measured at the weights as given, after a few steps at η = 0 that fill
    an Adam-family optimizer's state, and η is the lower of σ·c/λ and the noise-limited step those steps' gradients
    give (McCandlish et al. 2018): whichever binds first. σ was fitted on the calibration tasks of the evaluation and
    the band is where η* fell around the suggestion there; how far to trust it on a task of yours is on the
    evaluation page (``docs/experiments/suggest-lr.md``), with the cases where it fails: on its held-out task the
    suggestion was within 2× of the tuned η in 2 of 10 cases, so treat it as where a sweep should start, not as a
    tuned η.

    Args:
        model: the model, as training will start it; it comes back exactly as it was (parameters, buffers,
            ``requires_grad``, train/eval mode) and so does the global random state (torch's, CUDA's, Python's,
            NumPy's): the probe trains a copy.
        optimizer: a recipe name or class path as ``--optimizers`` takes them (``"adamw"``,
            ``"torch.optim.NAdam"``), built as ``optim.build_optimizer(optimizer, model, lr, weight_decay,
            decay_vectors=decay_vectors)``; or a function ``(params, lr) -> torch.optim.Optimizer`` given the
            copy's parameters that require grad.
        loss_fn: ``loss_fn(model, batch) -> scalar tensor``, the training loss (🤗: ``lambda m, b: m(**b).loss``).
        batches: any iterable of batches (a DataLoader, a list), drawn from as the probe steps and cycled when it
            runs out; tensors are moved to the model's device. A one-shot iterator is consumed as far as the probe
            draws.
        steps: the most forward+backward passes on one batch the probe may spend, all probes together (an
            optimizer step costs 1, a Hessian-vector product 2): an integer >= the method's least (13 for
            ``"limits"`` with an Adam-family optimizer; a refusal says it).
        method: ``"limits"`` (the default), ``"sharpness"``, ``"noise"``, ``"warmup"`` or ``"range-test"``
            (``METHODS``; the evaluation page compares them).
        weight_decay: λ, for a recipe name whose recipe decays (``adamw``, ``adaml2``).
        decay_vectors: for a recipe name: False leaves parameters of fewer than two dimensions undecayed.

    Returns:
        An [`LRSuggestion`][optiscope.suggest.LRSuggestion]: ``lr``, its band ``low`` … ``high``, the ``edge``,
            ``steps_used``, ``method``, the evidence (``probes``) and ``explain()``.

    Raises:
        SuggestionError: ``batches`` gives no batch; the optimizer's groups hold no lr; the loss is not finite at
            the first probe step; ``steps`` below the method's least (the message says it); no measurement was
            usable (every curvature measured was negative or not finite).
        ConfigError: ``optimizer`` names no recipe or class, or one that takes no lr.
        ValueError: ``steps`` not an integer >= 1, ``method`` unknown, ``weight_decay`` negative.
        TypeError: ``model`` not an ``nn.Module``, ``loss_fn`` not callable, ``batches`` not iterable,
            ``optimizer`` neither a name nor a function returning an optimizer.

    Examples:
        On L = ½ Σ aᵢwᵢ² the Hessian is diag(a): SGD's edge is 2/λ_max = 0.2 and its best constant step
        2/(λ_max + λ_min) = 0.18; ``method="sharpness"`` reads the edge alone.

        >>> import torch
        >>> from optiscope import suggest_lr
        >>> model = torch.nn.Linear(2, 1, bias=False)
        >>> def loss_fn(m, a):
        ...     return 0.5 * (a * m.weight[0] ** 2).sum()
        >>> s = suggest_lr(model, "sgd", loss_fn, [torch.tensor([10.0, 1.0])], steps=20, method="sharpness")
        >>> round(s.edge, 4), s.threshold, s.steps_used <= 20
        (0.2, '2/η', True)

    Notes:
        - **The band** is where η* fell, on the calibration tasks, around the suggestion: between ``low`` and
          ``high`` in 80 % of them. It is a statement about those tasks, not a confidence interval for yours.
        - **Optimizers without a known threshold** (Lion, Muon, the zoo's) get a fallback, said in ``method``
          ("fallback: range test") and ``notes``: an LR range test on the copy and its valley rule, scaled by its
          own fitted σ; it reads the loss, not the curvature.
        - **What the probe sees.** Curvature is measured in eval mode (``curvature.HessianOperator``: no dropout;
          batch norms keep the batch's statistics); the probe's steps run in the copy's own mode. A model with
          param groups at different lrs keeps their ratios, and η is the largest group's lr.
        - **Memory**: the copy doubles the model's parameters and buffers, and Lanczos keeps up to 20 vectors of
          their size.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"suggest_lr: model is a {type(model).__name__}, not a torch.nn.Module")
    if not callable(loss_fn):
        raise TypeError(f"suggest_lr: loss_fn is a {type(loss_fn).__name__}; give loss_fn(model, batch) -> loss")
    if not is_count(steps):
        raise ValueError(f"suggest_lr: steps={steps!r} must be an integer >= 1 (forward+backward passes)")
    if method not in METHODS:
        raise ValueError(f"suggest_lr: method={method!r}; valid: {', '.join(METHODS)}")
    if not non_negative(weight_decay):
        raise ValueError(f"suggest_lr: weight_decay={weight_decay!r} must be a finite number >= 0")
    with untouched(model):
        session = Session(model, optimizer, loss_fn, batches, steps, weight_decay, decay_vectors)
        chosen, name = METHODS[method], method
        if chosen.threshold and session.coefficient is None:
            chosen, name = METHODS[FALLBACK], f"fallback: {FALLBACK.replace('-', ' ')}"
            session.notes.append(
                f"{session.stability.reason}: a fallback, an LR range test read by its loss, not by the curvature"
            )
        least = chosen.least(session)
        if steps < least:
            raise SuggestionError(
                f"suggest_lr: steps={steps} is too few for one measurement by {name} with "
                f"{type(session.optimizer).__name__}; the least that works is {least}"
            )
        found = chosen.measure(session)
    if found is None:
        said = "; ".join(session.notes) or "no measurement was finite and positive"
        raise SuggestionError(f"suggest_lr: {name} read no edge from {steps} passes ({said})")
    lr = chosen.sigma * found
    return LRSuggestion(
        lr=lr,
        low=lr * chosen.band[0],
        high=lr * chosen.band[1],
        edge=found,
        sigma=chosen.sigma,
        method=name,
        optimizer=type(session.optimizer).__name__,
        threshold=session.stability.label,
        steps_used=session.spent,
        steps=steps,
        probes=session.probes,
        notes=session.notes,
    )
