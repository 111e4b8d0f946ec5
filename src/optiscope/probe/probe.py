r"""The probe: predicted (linear, quadratic) and true change of a functional after one step θ → θ + ηv.

For E sequences with n_i scored positions each (N = Σ n_i) and per-sequence sums S_i (of entropies, or
of losses), the functional is H = Σ_i S_i / N. Along v:

**fixed contexts** (held-out sequences, teacher-forced): H(η) = Σ_i S_i(η) / N exactly, so

    ΔH_true(η) = H(η) − H(0),   linear η·H′,   H′ = Σ_i S_i′/N,   quadratic ½η²·H″,   H″ = Σ_i S_i″/N.

**on-policy** (sequences x_i sampled from p_θ at temperature 1): the distribution of contexts moves with
θ, so H(η) is estimated by re-scoring the same sequences with self-normalised importance weights
w_i(η) = p_{θ+ηv}(x_i)/p_θ(x_i) (log-ratio clipped at ±c):

    Ĥ(η) = Σ_i w_i S_i(η) / Σ_i w_i n_i.

Its derivatives at η = 0 (w_i = 1, w_i′ = s_i = ∇log p(x_i)·v) include the score-function part:

    Ĥ′ = Σ_i [S_i′ + s_i (S_i − n_i H)] / N

and Ĥ″ follows from the quotient rule with w_i″ = s_i² + s_i′. In both modes the per-sequence terms
(``approx.per_sequence[i].gdotv``) sum to the total exactly, as do the per-sequence true contributions
w_i S_i(η)/Σ_j w_j n_j − (n_i/N)·H(0) that the seed's notebook rebuilds from ``true.entries[].diagnostics``.
η* = 2|H′|/|H″| is the step size at which the quadratic term equals the linear one.

Beyond the seed's fields, ``approx.per_sequence[i]`` also holds ``h_base`` (S_i at θ), ``d_sum`` (S_i′)
and, on-policy, ``score`` (s_i): enough to recompute every estimate on any subset of the sequences
(``subset_errors``).
"""

from __future__ import annotations

import copy
import math
import time
import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.func import functional_call

from ..checks import SEEDS, is_count, is_number, is_seed
from ..curvature.hvp import in_eval_mode, weight_norms_composed
from .calls import call_kwargs, forward_mode_attention, logits_of
from .functionals import check_logits, per_sequence
from .norms import check_max_norms_untied, composed_norms
from .terms import along, derivatives, fixed_state, gradient_dot, hessian_quadratic, unwrap

MODES = ("fixed", "policy")


def check_etas(etas: Sequence[float]) -> list[float]:
    if isinstance(etas, int | float) or (isinstance(etas, Tensor) and etas.ndim == 0):
        raise ValueError(f"etas={float(etas)!r} is one number; give the η grid as a list, e.g. [{float(etas)!r}]")
    if isinstance(etas, str | bytes) or not isinstance(etas, Iterable):
        raise ValueError(f"etas={etas!r} is not a list; give the η grid as a list of step sizes, e.g. [1e-3, 1e-2]")
    etas = list(etas)
    bad = [e for e in etas if not (is_number(e) or (isinstance(e, Tensor) and e.numel() == 1))]
    if bad:
        raise ValueError(f"the η grid {etas} holds {bad[0]!r}, not a number; give finite step sizes > 0")
    etas = [float(e) for e in etas]
    if not etas or any(not math.isfinite(e) or e <= 0 for e in etas):
        raise ValueError(f"the η grid {etas} must be a non-empty list of finite step sizes > 0")
    return sorted(etas)


@torch.no_grad()
def sample_sequences(
    model: nn.Module,
    starts: Tensor,
    length: int,
    block_size: int,
    generator: torch.Generator,
    attention_mask: Tensor | None = None,
) -> Tensor:
    """Sample ``length`` tokens after each prompt from the model at temperature 1, for an on-policy probe.

    Each token is drawn from p_θ(· | x_{<t}) = softmax(logits) of the last position, over the last
    ``block_size`` tokens. The model is sampled as ``probe_step`` scores it, whose importance weights
    w_i = p_{θ+ηv}(x_i)/p_θ(x_i) assume as much.

    Args:
        model: a module mapping token ids (E, T) to next-token logits (E, T, V) (or an output holding them:
            a 🤗 output's ``.logits``, a tuple's first element).
        starts: integer token ids: one start token per sequence, shape (E,), or left-padded prompts (E, P).
        length: how many tokens to sample after each prompt; an integer ≥ 1.
        block_size: the model's context in tokens: the window it sees; an integer ≥ 1.
        generator: the ``torch.Generator`` to draw with (a CPU generator draws the same sequences for a model
            on any device); the global random stream is left alone.
        attention_mask: the prompts' mask (1 = real token), of the shape of ``starts``, or None.

    Returns:
        Token ids of shape (E, P + length): the prompts followed by the sampled tokens. The sampled tokens are
            all real, so the mask of the result is the prompts' mask followed by ones.

    Raises:
        ValueError: ``starts`` not a 1-D or 2-D tensor of integer ids with E, P ≥ 1; ``length`` or
            ``block_size`` not an integer ≥ 1; ``attention_mask`` of another shape; an embedding with
            ``max_norm`` whose weight another module holds (a tied output head).
        TypeError: ``generator`` is not a ``torch.Generator``.

    Examples:
        >>> import torch
        >>> from optiscope.probe import sample_sequences
        >>> _ = torch.manual_seed(0)
        >>> model = torch.nn.Sequential(torch.nn.Embedding(8, 4), torch.nn.Linear(4, 8))  # ids -> logits
        >>> starts = torch.zeros(4, dtype=torch.long)  # one start token per sequence
        >>> generator = torch.Generator().manual_seed(0)
        >>> sequences = sample_sequences(model, starts, length=5, block_size=8, generator=generator)
        >>> sequences.shape
        torch.Size([4, 6])

    Notes:
        The model is sampled in eval mode (no dropout, which would also draw from the global random stream; each
        module's own flag is restored after), on copies of its buffers (a forward pass that counts its calls
        leaves the count), with the probe's normalisations (``norms``: an embedding's ``max_norm`` rescales a
        copy of its weight; one whose weight another module holds, a tied output head, is refused).
    """
    check_sampling(starts, length, block_size, generator, attention_mask)
    net = unwrap(model)
    check_max_norms_untied(net, "sample_sequences")
    seq = starts.reshape(len(starts), -1)
    mask = None if attention_mask is None else attention_mask.reshape(seq.shape)
    state = fixed_state(net, {})  # one set of buffer copies for the whole draw, not one per token
    with in_eval_mode(net), composed_norms():
        for _ in range(length):
            window = None if mask is None else mask[:, -block_size:]
            kwargs = call_kwargs(net, window)
            logits = logits_of(functional_call(net, state, (seq[:, -block_size:],), kwargs))
            seq, mask = _extended(seq, mask, logits, generator)
    return seq


def _extended(
    seq: Tensor, mask: Tensor | None, logits: Tensor, generator: torch.Generator
) -> tuple[Tensor, Tensor | None]:
    """``seq`` with one token drawn from the last position's logits at temperature 1, and its mask with a 1."""
    probs = torch.softmax(logits[:, -1].double(), dim=-1)
    # drawn where the generator lives: a CPU generator draws the same sequences for a model on any device
    drawn = torch.multinomial(probs.to(generator.device), 1, generator=generator)
    seq = torch.cat([seq, drawn.to(seq.device)], dim=1)
    return seq, None if mask is None else torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)


def check_sampling(starts: Any, length: Any, block_size: Any, generator: Any, attention_mask: Any) -> None:
    """One-line errors for ``sample_sequences``' arguments that would fail deep inside the model, or sample nothing."""
    if not isinstance(starts, Tensor) or starts.ndim not in (1, 2) or len(starts) == 0 or starts.shape[-1] == 0:
        shape = tuple(starts.shape) if isinstance(starts, Tensor) else type(starts).__name__
        raise ValueError(
            f"sample_sequences: starts is {shape}; give token ids of one start token per sequence (E,) or of "
            "prompts (E, P), E and P >= 1"
        )
    if starts.is_floating_point() or starts.is_complex() or starts.dtype == torch.bool:
        raise ValueError(f"sample_sequences: starts must be integer token ids, got dtype {starts.dtype}")
    if not is_count(length):
        raise ValueError(f"sample_sequences: length={length!r}; valid: the number of tokens to sample, an integer >= 1")
    if not is_count(block_size):
        raise ValueError(
            f"sample_sequences: block_size={block_size!r}; valid: the model's context in tokens, an integer >= 1"
        )
    if not isinstance(generator, torch.Generator):
        raise TypeError(
            f"sample_sequences: generator is a {type(generator).__name__}; give a torch.Generator, e.g. "
            "torch.Generator().manual_seed(0)"
        )
    if attention_mask is not None and (
        not isinstance(attention_mask, Tensor) or attention_mask.numel() != starts.numel()
    ):
        shape = tuple(attention_mask.shape) if isinstance(attention_mask, Tensor) else type(attention_mask).__name__
        raise ValueError(
            f"sample_sequences: attention_mask is {shape}; give None or a tensor of the prompts' shape "
            f"{tuple(starts.shape)}"
        )


def _chunks(n: int, size: int) -> list[slice]:
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


def _concat(parts: list[tuple[tuple[Tensor, ...], ...]], k: int) -> list[Tensor]:
    """Join the chunks' k-th result (values, first or second derivatives), output by output."""
    return [torch.cat([part[k][j] for part in parts]) for j in range(len(parts[0][k]))]


def probe_step(
    model: nn.Module,
    direction: dict[str, Tensor],
    sequences: Tensor,
    etas: Sequence[float],
    *,
    mode: str = "fixed",
    functional: str = "entropy",
    chunk_size: int = 64,
    log_ratio_clip: float = 20.0,
    precision: str = "float64",
    reverse_check: bool = False,
    attention_mask: Tensor | None = None,
    scored: Tensor | None = None,
) -> dict[str, Any]:
    """What one step θ → θ + ηv does to the mean next-token entropy H (or loss): predicted and measured.

    H is the mean per scored token over the E sequences. The probe predicts, from one nested forward-mode
    pass (``torch.func.jvp`` of ``jvp``) for every sequence at once,

        ΔH(η) ≈ η·H′ + ½η²·H″,   H′ = ∇H·v,   H″ = vᵀ∇²H v,

    and measures the true ΔH(η) = H(θ + ηv) − H(θ) at each η of the grid. On fixed contexts (held-out text,
    teacher-forced) the true ΔH is exact; on-policy (sequences sampled from the model at temperature 1) H(η) is
    estimated by re-scoring the same sequences with self-normalised importance weights
    w_i = p_{θ+ηv}(x_i)/p_θ(x_i), and H′ carries the score-function part Σ_i s_i (S_i − n_i H)/N with
    s_i = ∇log p(x_i)·v.

    Args:
        model: a module mapping token ids (E, T) to next-token logits (E, T, V) (or an output holding them:
            a 🤗 output's ``.logits``, a tuple's first element); may be wrapped in DDP or compiled.
        direction: v by parameter name, as ``update_direction`` returns it; finite, on the parameters' device
            and of their shapes.
        sequences: integer token ids of shape (E, T + 1), E ≥ 1, T ≥ 1: inputs are ``[:, :-1]``, targets
            ``[:, 1:]``; on the model's device.
        etas: the grid of step sizes η at which to measure the true ΔH: a list of finite numbers > 0.
        mode: ``"fixed"`` (teacher-forced contexts) or ``"policy"`` (sequences sampled from the model with
            ``sample_sequences``).
        functional: ``"entropy"`` (−Σ_k p_k log p_k, exact over the vocabulary) or ``"loss"`` (cross-entropy).
        chunk_size: sequences per forward pass, which bounds the memory; an integer ≥ 1.
        log_ratio_clip: c, which clips the importance weights' log-ratios to ±c in policy mode; a number > 0
            (``math.inf``: no clipping).
        precision: ``"float64"`` evaluates a float64 copy of the model (exact enough to see ΔH of 1e-9);
            ``"model"`` keeps the model's dtype (not for a float16 or bfloat16 model).
        reverse_check: also compute H′ and H″ by reverse mode (``approx.reverse``: ∇H·v by backprop, vᵀ(∇²H v)
            by a Hessian-vector product), for fixed contexts only: in policy mode it is ignored, with a warning.
        attention_mask: for a padded batch of a 🤗 model, (E, T + 1) with 1 for real tokens, or None.
        scored: an (E, T) mask of the positions t whose next-token distribution counts, or None: by default
            those where both x_t and x_{t+1} are real tokens. On-policy with prompts, pass the sampled positions
            only (their log-probabilities are the importance weights).

    Returns:
        The seed notebook's ``results.json`` layout: ``mode``, ``functional``, ``E``, ``T``, ``base_value``
            (H(θ)), ``timings``; ``approx`` with ``delta_h_per_lr`` (H′), ``quadratic`` (``gdotv`` = H′,
            ``vHvv`` = H″), ``eta_star`` (2|H′|/|H″|, where the quadratic term equals the linear one),
            ``per_sequence`` (per sequence i: ``gdotv``, its share of H′, the shares summing to it; ``h_base``,
            its summed entropy S_i; ``d_sum``, S_i′; on-policy ``score``, s_i) and, with ``reverse_check``,
            ``reverse``; ``true.entries``, one per η (sorted): ``eta``, ``delta_h_true`` and ``diagnostics``
            (``weights_sum``, ``normalized_weights``, all 1 for fixed contexts, ``token_counts`` n_i, ``h_new``
            S_i(η), ``base_entropy`` H(θ), ``ess``, ``clipped``).

    Raises:
        ValueError: ``mode``, ``precision``, ``functional``, ``etas``, ``chunk_size`` or ``log_ratio_clip``
            invalid; an empty ``direction``, or an entry of the wrong shape or device, or not finite;
            ``sequences`` not integer ids of shape (E, T + 1) in the model's vocabulary and on its device;
            ``attention_mask`` or ``scored`` of the wrong shape, or no position scored; ``precision="model"``
            on a half-precision model; a model without forward-mode AD rules; an embedding with ``max_norm``
            tied to another module.
        TypeError: ``direction`` is not a dict of tensors, or ``sequences`` not a tensor.

    Examples:
        >>> import torch
        >>> from optiscope.probe import probe_step, update_direction
        >>> _ = torch.manual_seed(0)
        >>> model = torch.nn.Sequential(torch.nn.Embedding(8, 4), torch.nn.Linear(4, 8))  # ids -> logits
        >>> def loss_fn(m, batch):
        ...     return torch.nn.functional.cross_entropy(m(batch[:, :-1]).flatten(0, 1), batch[:, 1:].flatten())
        >>> sgd = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> v = update_direction(model, sgd, loss_fn, torch.randint(0, 8, (4, 6)))
        >>> result = probe_step(model, v, torch.randint(0, 8, (16, 6)), etas=[1e-3, 1e-2])
        >>> result["E"], result["T"], [e["eta"] for e in result["true"]["entries"]]
        (16, 5, [0.001, 0.01])
        >>> H1, H2 = result["approx"]["delta_h_per_lr"], result["approx"]["quadratic"]["vHvv"]
        >>> true = result["true"]["entries"][0]["delta_h_true"]  # at η = 1e-3
        >>> abs((1e-3 * H1 + 0.5e-6 * H2) / true - 1) < 1e-6  # the quadratic prediction
        True

    Notes:
        The model is measured in eval mode: no dropout, batch norms on their running statistics (each
        submodule's own train/eval flag is restored after); a forward pass that updates a buffer in place (a
        call counter) updates a copy. ``chunk_size`` changes no result, except for a model that normalises by
        the batch (a batch norm without running statistics), where each chunk is its batch.

        Forward-mode AD: for the duration of a probe ``F.scaled_dot_product_attention`` runs its math backend
        and a 🤗 model uses ``eager`` attention (``calls.forward_mode_attention``; the fused attention kernels
        have no forward-mode rules), and torch's ``nn.MultiheadAttention`` fast path is off. torch 2.13's
        ``layer_norm``, ``batch_norm`` and ``instance_norm`` kernels have wrong nested forward-mode second
        derivatives, so ``F.layer_norm``, ``F.batch_norm`` and ``F.instance_norm`` are computed from ordinary
        ops meanwhile (``optiscope.probe.norms``; a model that calls ``torch.layer_norm`` itself is not
        covered), as is weight norm. ``F.embedding`` computes an embedding's ``max_norm`` rescaling out of
        place; an embedding with ``max_norm`` whose weight another module holds (a tied output head) is
        refused (``norms``), as is an ``nn.EmbeddingBag`` whose weight the direction moves.
    """
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}; valid: {', '.join(MODES)}")
    if precision not in ("float64", "model"):
        raise ValueError(f"precision={precision!r}; valid: float64, model")
    if reverse_check and mode == "policy":
        warnings.warn(
            "reverse_check=True is ignored in mode='policy': the reverse-mode check covers fixed contexts only",
            stacklevel=2,
        )
    if not isinstance(direction, dict):
        raise TypeError(
            f"direction is a {type(direction).__name__}; give a dict of tensors by parameter name (update_direction's)"
        )
    if not direction:
        raise ValueError("the direction is empty: the step moves no parameter")
    etas = check_etas(etas)
    if not isinstance(sequences, Tensor):
        raise TypeError(
            f"sequences is a {type(sequences).__name__}; give a torch.Tensor of token ids of shape (E, T+1)"
        )
    if sequences.ndim != 2 or sequences.shape[1] < 2:
        raise ValueError(f"sequences must be token ids of shape (E, T+1) with T >= 1, got {tuple(sequences.shape)}")
    if len(sequences) == 0:
        raise ValueError("sequences is empty (E = 0): the probe needs at least one sequence")
    if not is_count(chunk_size):
        raise ValueError(f"chunk_size={chunk_size!r}; valid: a positive number of sequences per chunk")
    if not (is_number(log_ratio_clip) and log_ratio_clip > 0):
        raise ValueError(f"log_ratio_clip={log_ratio_clip!r}; valid: a number > 0 (inf: no clipping)")
    scored = scored_positions(sequences, attention_mask, scored)
    net = unwrap(model)
    params = dict(net.named_parameters())
    for name, v in direction.items():
        if not isinstance(v, Tensor):
            raise TypeError(f"direction[{name!r}] is a {type(v).__name__}; give a torch.Tensor (update_direction's)")
        if name in params and v.shape != params[name].shape:
            raise ValueError(
                f"direction[{name!r}] has shape {tuple(v.shape)}; the parameter's is {tuple(params[name].shape)}"
            )
        if name in params and v.device != params[name].device:
            raise ValueError(
                f"direction[{name!r}] is on {v.device} but the parameter is on {params[name].device}: move the "
                "direction to the model's device"
            )
        if not bool(torch.isfinite(v).all()):
            raise ValueError(f"direction[{name!r}] is not finite (a step that diverged?): there is no step to probe")
    check_max_norms_untied(net, "probe_step")
    half = sorted({str(p.dtype) for p in net.parameters() if p.dtype in (torch.float16, torch.bfloat16)})
    if precision == "model" and half:
        # ΔH of one step is ~1e-6 and below; half precision rounds it away and its derivatives overflow.
        raise ValueError(
            f"precision='model' on a {', '.join(half)} model cannot resolve one step; use precision='float64'"
        )
    if precision == "float64":
        net = float64_copy(net)
        direction = {n: v.double() for n, v in direction.items()}
    with in_eval_mode(net), forward_mode_attention(net), composed_norms(), weight_norms_composed(net):
        check_token_ids(net, sequences)
        return _probe(
            net,
            direction,
            sequences,
            etas,
            mode,
            functional,
            chunk_size,
            log_ratio_clip,
            reverse_check,
            attention_mask,
            scored,
        )


def float64_copy(net: nn.Module) -> nn.Module:
    """A float64 copy of ``net``, only evaluated (no graph). A tensor a module computes from its parameters and
    keeps as a plain attribute (the hook-based weight norm's ``weight``, recomputed before every forward pass)
    has no deep copy in torch: the copy holds it detached."""
    computed = [t for m in net.modules() for t in vars(m).values() if isinstance(t, Tensor) and t.grad_fn is not None]
    memo: dict[int, Any] = {id(t): t.detach().clone() for t in computed}
    return copy.deepcopy(net, memo).double().requires_grad_(False)


def check_token_ids(net: nn.Module, sequences: Tensor) -> None:
    """``sequences`` must hold integer ids the model has logits for: an id outside the vocabulary would fail
    deep inside an embedding or a gather. The vocabulary is read from the logits of one sequence of id 0 as long
    as the inputs (a model may need that much context), computed on copies of the buffers (``fixed_state``): a
    forward pass that counts its calls leaves the model's count."""
    if sequences.is_floating_point() or sequences.is_complex() or sequences.dtype == torch.bool:
        raise ValueError(f"sequences must be integer token ids, got dtype {sequences.dtype}")
    device = next(net.parameters()).device
    if sequences.device != device:
        raise ValueError(
            f"sequences are on {sequences.device} but the model is on {device}: pass sequences.to('{device}')"
        )
    with torch.no_grad():
        zeros = torch.zeros_like(sequences[:1, :-1])
        logits = functional_call(net, fixed_state(net, {}), (zeros,), call_kwargs(net, None))
        vocabulary = check_logits(logits).shape[-1]
    bad = (sequences < 0) | (sequences >= vocabulary)
    if bool(bad.any()):
        i, t = (int(j) for j in bad.nonzero()[0])
        raise ValueError(
            f"sequences[{i}, {t}] = {int(sequences[i, t])} is not a token id of the model: valid ids are "
            f"0..{vocabulary - 1}"
        )


def scored_positions(sequences: Tensor, attention_mask: Tensor | None, scored: Tensor | None) -> Tensor | None:
    """The checked (E, T) mask of scored positions, or None when every position counts."""
    E, T = sequences.shape[0], sequences.shape[1] - 1
    if attention_mask is not None and tuple(attention_mask.shape) != tuple(sequences.shape):
        raise ValueError(
            f"attention_mask has shape {tuple(attention_mask.shape)}; it must match sequences {(E, T + 1)}"
        )
    if scored is None and attention_mask is not None:
        real = attention_mask.bool()
        scored = real[:, :-1] & real[:, 1:]
    if scored is None:
        return None
    if tuple(scored.shape) != (E, T):
        raise ValueError(f"scored has shape {tuple(scored.shape)}; it must be (E, T) = {(E, T)}")
    if not scored.any():
        raise ValueError("no position is scored: every sequence is padding")
    return scored.bool()


def _probe(
    net: nn.Module,
    direction: dict[str, Tensor],
    sequences: Tensor,
    etas: list[float],
    mode: str,
    functional: str,
    chunk_size: int,
    clip: float,
    reverse_check: bool,
    attention_mask: Tensor | None,
    scored: Tensor | None,
) -> dict[str, Any]:
    policy = mode == "policy"
    inputs, targets = sequences[:, :-1], sequences[:, 1:]
    masks = None if attention_mask is None else attention_mask[:, :-1]
    if scored is None:
        n = torch.full((len(sequences),), float(inputs.shape[1]), dtype=torch.float64, device=sequences.device)
    else:
        n = scored.sum(1).double()

    def chunk(s: slice) -> tuple[Any, ...]:
        """along()'s arguments for the sequences in ``s``."""
        return (
            inputs[s],
            targets[s],
            functional,
            policy,
            None if masks is None else masks[s],
            None if scored is None else scored[s],
        )

    total_tokens = float(n.sum())
    started = time.perf_counter()
    parts = []
    for s in _chunks(len(sequences), chunk_size):
        f = along(net, direction, *chunk(s))
        try:
            parts.append(derivatives(f))
        except NotImplementedError as e:
            raise ValueError(
                "the model's forward pass does not support forward-mode AD, which the probe needs "
                f"({str(e).splitlines()[0]}); use plain tensor ops there"
            ) from e
    value, first, second = (_concat(parts, k) for k in range(3))
    seconds_terms = time.perf_counter() - started
    S, dS, d2S = value[0], first[0], second[0]
    H = float(S.sum()) / total_tokens
    if policy:
        s_i, ds_i = first[1], second[1]
        per_seq = (dS + s_i * (S - n * H)) / total_tokens
        quadratic = _snis_second_derivative(S, dS, d2S, s_i, ds_i, n)
    else:
        per_seq = dS / total_tokens
        quadratic = float(d2S.sum()) / total_tokens
    linear = float(per_seq.sum())

    started = time.perf_counter()
    entries = []
    for eta in etas:
        S_eta, logp_eta = [], []
        with torch.no_grad():
            for s in _chunks(len(sequences), chunk_size):
                out = along(net, direction, *chunk(s))(torch.tensor(eta, dtype=torch.float64))
                S_eta.append(out[0])
                if policy:
                    logp_eta.append(out[1])
        S_eta = torch.cat(S_eta)
        if policy:
            log_ratio = torch.cat(logp_eta) - value[1]
            clipped = int((log_ratio.abs() > clip).sum())
            w = log_ratio.clamp(-clip, clip).exp()
        else:
            clipped, w = 0, torch.ones_like(S_eta)
        h_new = float((w * S_eta).sum() / (w * n).sum())
        entries.append(
            {
                "eta": eta,
                "delta_h_true": h_new - H,
                "diagnostics": {
                    "weights_sum": float(w.sum()),
                    "normalized_weights": (w / w.sum()).tolist(),
                    "token_counts": n.tolist(),
                    "h_new": S_eta.tolist(),
                    "base_entropy": H,
                    "ess": float(w.sum() ** 2 / (w**2).sum()),
                    "clipped": clipped,
                },
            }
        )
    seconds_true = time.perf_counter() - started

    columns = {"gdotv": per_seq, "h_base": S, "d_sum": dS, **({"score": first[1]} if policy else {})}
    approx: dict[str, Any] = {
        "delta_h_per_lr": linear,
        "quadratic": {"gdotv": linear, "vHvv": quadratic},
        "per_sequence": [
            dict(zip(columns, row, strict=True)) for row in zip(*(c.tolist() for c in columns.values()), strict=True)
        ],
        "eta_star": 2 * abs(linear) / abs(quadratic) if quadratic != 0 else math.inf,
    }
    if reverse_check and not policy:
        approx["reverse"] = _reverse_terms(net, direction, *chunk(slice(None))[:3], masks, scored, total_tokens)
    return {
        "mode": mode,
        "functional": functional,
        "E": len(sequences),
        "T": int(inputs.shape[1]),
        "base_value": H,
        "approx": approx,
        "true": {"entries": entries},
        "timings": {"terms_seconds": seconds_terms, "true_seconds": seconds_true},
    }


def _snis_second_derivative(S: Tensor, dS: Tensor, d2S: Tensor, s: Tensor, ds: Tensor, n: Tensor) -> float:
    """Ĥ″(0) for Ĥ = A/B, A = Σ w S, B = Σ w n, with w = 1, w′ = s, w″ = s² + s′ at η = 0."""
    w1, w2 = s, s**2 + ds
    A, A1, A2 = S.sum(), (w1 * S + dS).sum(), (w2 * S + 2 * w1 * dS + d2S).sum()
    B, B1, B2 = n.sum(), (w1 * n).sum(), (w2 * n).sum()
    return float(A2 / B - 2 * A1 * B1 / B**2 - A * B2 / B**2 + 2 * A * B1**2 / B**3)


def _reverse_terms(
    net: nn.Module,
    direction: dict[str, Tensor],
    inputs: Tensor,
    targets: Tensor,
    functional: str,
    masks: Tensor | None,
    scored: Tensor | None,
    total_tokens: float,
) -> dict[str, float]:
    """The fixed-context totals again, by reverse mode: ∇H·v and the Hessian-vector product vᵀ(∇²H v)."""
    kwargs = call_kwargs(net, masks)

    def total(params: dict[str, Tensor]) -> Tensor:
        logits = check_logits(functional_call(net, {**fixed_state(net, direction), **params}, (inputs,), kwargs))
        return per_sequence(functional, logits, targets, scored).sum() / total_tokens

    return {"gdotv": gradient_dot(net, direction, total), "vHvv": hessian_quadratic(net, direction, total)}


def prediction_curves(result: dict[str, Any]) -> dict[str, list[float]]:
    """A probe's true change of H and its two predictions over its η grid, for a plot.

    linear(η) = η·H′ and quadratic(η) = η·H′ + ½η²·H″, with H′ = ``approx.delta_h_per_lr`` and
    H″ = ``approx.quadratic.vHvv``.

    Args:
        result: what ``probe_step`` returned (or its ``results.json``).

    Returns:
        ``eta``, ``true`` (ΔH measured), ``linear`` and ``quadratic``: lists of floats, sorted by η.

    Examples:
        >>> import torch
        >>> from optiscope.probe import prediction_curves, probe_step, update_direction
        >>> _ = torch.manual_seed(0)
        >>> model = torch.nn.Sequential(torch.nn.Embedding(8, 4), torch.nn.Linear(4, 8))  # ids -> logits
        >>> def loss_fn(m, batch):
        ...     return torch.nn.functional.cross_entropy(m(batch[:, :-1]).flatten(0, 1), batch[:, 1:].flatten())
        >>> sgd = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> v = update_direction(model, sgd, loss_fn, torch.randint(0, 8, (4, 6)))
        >>> result = probe_step(model, v, torch.randint(0, 8, (16, 6)), etas=[1e-3, 1e-2])
        >>> curves = prediction_curves(result)
        >>> sorted(curves), curves["eta"]
        (['eta', 'linear', 'quadratic', 'true'], [0.001, 0.01])
        >>> abs(curves["quadratic"][1] - curves["true"][1]) < abs(curves["linear"][1] - curves["true"][1])
        True
    """
    entries = sorted(result["true"]["entries"], key=lambda e: e["eta"])
    eta = np.array([e["eta"] for e in entries], dtype=float)
    first, second = result["approx"]["delta_h_per_lr"], result["approx"]["quadratic"]["vHvv"]
    return {
        "eta": eta.tolist(),
        "true": [float(e["delta_h_true"]) for e in entries],
        "linear": (first * eta).tolist(),
        "quadratic": (first * eta + 0.5 * second * eta**2).tolist(),
    }


def subset_errors(result: dict[str, Any], eta: float, size: int, count: int, seed: int) -> dict[str, Any]:
    """How far the linear prediction can be trusted on a smaller evaluation batch: its error on random subsets.

    For each of ``count`` random subsets S of ``size`` sequences, at step size η, the relative error
    (η·H′_S − ΔH_S)/|ΔH_S| of the linear prediction, each subset scored as if it were the whole batch (its own
    H, weights and N), from the per-sequence terms the probe kept.

    Args:
        result: what ``probe_step`` returned.
        eta: one of the probed step sizes η.
        size: sequences per subset; an integer from 1 to E.
        count: how many subsets to draw; an integer ≥ 1.
        seed: the seed of the subsets' draw.

    Returns:
        ``eta``, ``size``, ``count``, ``seed``, ``errors`` (one relative error per subset; NaN where the true
            change is 0) and the ``mean`` and ``std`` of the finite ones (NaN for none, or for one for ``std``).

    Raises:
        ValueError: ``eta`` is not on the probed grid; ``size`` outside 1..E; ``count`` < 1; a seed torch
            cannot take.

    Examples:
        >>> import torch
        >>> from optiscope.probe import probe_step, subset_errors, update_direction
        >>> _ = torch.manual_seed(0)
        >>> model = torch.nn.Sequential(torch.nn.Embedding(8, 4), torch.nn.Linear(4, 8))  # ids -> logits
        >>> def loss_fn(m, batch):
        ...     return torch.nn.functional.cross_entropy(m(batch[:, :-1]).flatten(0, 1), batch[:, 1:].flatten())
        >>> sgd = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> v = update_direction(model, sgd, loss_fn, torch.randint(0, 8, (4, 6)))
        >>> result = probe_step(model, v, torch.randint(0, 8, (16, 6)), etas=[1e-3, 1e-2])
        >>> out = subset_errors(result, eta=1e-2, size=4, count=3, seed=0)
        >>> len(out["errors"]), abs(out["mean"]) < 0.1
        (3, True)
    """
    grid = [e["eta"] for e in result["true"]["entries"]]
    entry = next(
        (e for e in result["true"]["entries"] if is_number(eta) and math.isclose(e["eta"], eta, rel_tol=1e-9)), None
    )
    if entry is None:
        raise ValueError(f"subset_errors: eta={eta!r} is not on the probed grid; valid: one of {grid}")
    total = len(result["approx"]["per_sequence"])
    if not (is_count(size) and size <= total):
        raise ValueError(f"subset_errors: size={size!r}; valid: an integer from 1 to the number of sequences E={total}")
    if not is_count(count):
        raise ValueError(f"subset_errors: count={count!r}; valid: the number of subsets to draw, an integer >= 1")
    if not is_seed(seed):
        raise ValueError(f"subset_errors: seed={seed!r}; valid: {SEEDS}")
    seqs = result["approx"]["per_sequence"]
    base = torch.tensor([r["h_base"] for r in seqs], dtype=torch.float64)
    d_sum = torch.tensor([r["d_sum"] for r in seqs], dtype=torch.float64)
    score = torch.tensor([r.get("score", 0.0) for r in seqs], dtype=torch.float64)
    d = entry["diagnostics"]
    n = torch.tensor(d["token_counts"], dtype=torch.float64)
    h_new = torch.tensor(d["h_new"], dtype=torch.float64)
    w = torch.tensor(d["normalized_weights"], dtype=torch.float64) * d["weights_sum"]
    generator = torch.Generator().manual_seed(seed)
    errors = []
    for _ in range(count):
        idx = torch.randperm(total, generator=generator)[:size]
        tokens = n[idx].sum()
        h = base[idx].sum() / tokens
        true = (w[idx] * h_new[idx]).sum() / (w[idx] * n[idx]).sum() - h
        linear = eta * (d_sum[idx] + score[idx] * (base[idx] - n[idx] * h)).sum() / tokens
        errors.append(float((linear - true) / true.abs()) if true != 0 else math.nan)
    finite = torch.tensor([e for e in errors if math.isfinite(e)], dtype=torch.float64)
    return {
        "eta": eta,
        "size": size,
        "count": count,
        "seed": seed,
        "errors": errors,
        "mean": float(finite.mean()) if len(finite) else math.nan,
        "std": float(finite.std()) if len(finite) > 1 else math.nan,
    }
