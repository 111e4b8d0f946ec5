"""Sharded parameters (FSDP2, FSDP1) as the whole model's: each rank's parts, summed over the shard group.

Under FSDP a rank holds a shard of each parameter (FSDP2: a ``DTensor`` placed ``Shard(0)``, its local rows;
FSDP1: a *flat* parameter, a slice of the concatenation of several parameters, or with ``use_orig_params``
each parameter's view into that slice). A ``Layout`` maps every tensor the optimizer steps to its ``Part``s on
this rank: a run of elements of one user parameter (``index`` into ``Layout.names``, the names of the
user's model), where it lies in the local tensor (``start:stop``) and in the parameter flattened
(``offset``). Squared norms, dot products and counts are sums over elements, so summing each rank's parts
(one ``all_reduce``) gives the unsharded values exactly up to float rounding; min and max reduce exactly;
a median is taken over the same strided sample of the parameter that the unsharded monitor takes
(``stats.sampled``), each rank sending the entries at its own global positions: exact.

A tensor the optimizer steps that is whole on every rank (a ``Replicate`` DTensor, one FSDP ignores, an FSDP1
``NO_SHARD`` flat parameter) is counted on the group's first rank only. What is refused, in one line:
DeepSpeed ZeRO parameters, tensor parallelism (DTensor placements other than one ``Shard(0)`` or
``Replicate``), hybrid sharding (HSDP: a 2-D mesh, FSDP1's ``HYBRID_SHARD``) and shards over several process
groups.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from .. import collectives
from ..collectives import collective_device
from . import stats
from .names import clean_name


def local(t: Tensor) -> Tensor:
    """A DTensor's local shard, any other tensor itself (DTensor looked up only once something imported it)."""
    dtensor = sys.modules.get("torch.distributed.tensor")
    return t.to_local() if dtensor is not None and isinstance(t, dtensor.DTensor) else t


@dataclass(frozen=True)
class Part:
    """A run of one user parameter's elements in a tensor the optimizer steps, on this rank."""

    param: Tensor  # the tensor the optimizer steps
    index: int  # the user parameter's place in ``Layout.names``
    start: int  # the run in ``param``'s local tensor, flattened
    stop: int
    offset: int  # where the run begins in the user parameter, flattened

    def of(self, t: Tensor) -> Tensor:
        """The run's entries of ``t`` (the parameter, its gradient or a state tensor shaped like it), 1-D."""
        return local(t).detach().reshape(-1)[self.start : self.stop]


@dataclass
class Layout:
    """Every user parameter the optimizer steps (in one order on every rank) and this rank's parts of them."""

    group: Any  # the process group the parts are summed over
    names: list[str] = field(default_factory=list)
    numels: list[int] = field(default_factory=list)
    groups: list[int] = field(default_factory=list)  # each parameter's param group
    parts: dict[int, list[Part]] = field(default_factory=dict)  # by id of the tensor the optimizer steps

    def add(self, name: str, numel: int, group: int) -> int:
        if name in self.names:
            return self.names.index(name)
        self.names.append(name)
        self.numels.append(numel)
        self.groups.append(group)
        return len(self.names) - 1

    def parts_of(self, params: list[Tensor]) -> list[Part]:
        """This rank's parts of ``params``, in order."""
        return [part for p in params for part in self.parts.get(id(p), [])]


def refusal(model: nn.Module, optimizer: torch.optim.Optimizer) -> str | None:
    """Why the monitor cannot measure this sharding exactly, in one line; None when it can."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if any(hasattr(p, "ds_id") or hasattr(p, "ds_numel") for p in params):
        return "DeepSpeed ZeRO partitions the parameters in its own way; use FSDP (fully_shard) or DDP"
    for p in params:
        placements = getattr(p, "placements", None)
        if placements is None:
            continue
        names = [type(pl).__name__ for pl in placements]
        if p.device_mesh.ndim != 1:
            mesh = f"a {p.device_mesh.ndim}-D device mesh {names}"
            return f"a parameter on {mesh} (HSDP or tensor parallel); shard on a 1-D mesh"
        if names != ["Replicate"] and not (names == ["Shard"] and placements[0].dim == 0):
            return f"a parameter placed {placements} (tensor parallel); only FSDP's Shard(0) or Replicate are measured"
    for handle in _fsdp1_handles(model).values():
        if "HYBRID" in handle._sharding_strategy.name:
            return f"FSDP1's {handle._sharding_strategy.name} (HSDP); use FULL_SHARD or SHARD_GRAD_OP"
    return None


def _fsdp1_handles(model: nn.Module) -> dict[int, Any]:
    """FSDP1's flat-parameter handles in ``model``, keyed by the id of their flat parameter."""
    if "torch.distributed.fsdp" not in sys.modules:
        return {}
    from torch.distributed.fsdp import FullyShardedDataParallel

    return {
        id(m._handle.flat_param): m._handle
        for m in model.modules()
        if isinstance(m, FullyShardedDataParallel) and m._handle is not None
    }


def layout(model: nn.Module, optimizer: torch.optim.Optimizer, names: dict[int, str]) -> Layout | None:
    """The layout of a sharded model's parameters, or None for one that FSDP does not shard.

    Args:
        model: the model (FSDP1's wrappers are found inside it).
        optimizer: what steps the shards.
        names: the monitor's names of the tensors the optimizer steps (``parameter_names``), by id.

    Raises:
        ValueError: a sharding the monitor does not measure (``refusal``).
    """
    reason = refusal(model, optimizer)
    if reason is not None:
        raise ValueError(f"Monitor: {reason}")
    handles = _fsdp1_handles(model)
    # use_orig_params: the parameters the optimizer steps are views into their flat parameter's shard
    orig = {id(q): (h.flat_param, i) for h in handles.values() for i, q in enumerate(h.flat_param._params or [])}
    flat_names = {id(p): n for n, p in model.named_parameters() if id(p) in handles}
    groups = {h.process_group for h in handles.values()}  # NO_SHARD too: its flat parameters need naming
    params = [(gi, p) for gi, group in enumerate(optimizer.param_groups) for p in group["params"]]
    groups |= {p.device_mesh.get_group() for _, p in params if getattr(p, "placements", None) is not None}
    if not groups:
        return None
    if len(groups) > 1:
        raise ValueError("Monitor: parameters sharded over several process groups; shard them over one")
    out = Layout(group=groups.pop())
    first = dist.get_rank(out.group) == 0
    for gi, p in params:
        if id(p) in handles:  # FSDP1, use_orig_params=False: several parameters in one flat one
            flat, handle = p, handles[id(p)]
            prefix = clean_name(flat_names[id(p)])[: -len("_flat_param")]
            for i, info in enumerate(flat._shard_param_infos):
                index = out.add(prefix + clean_name(flat._fqns[i]), flat._numels[i], gi)
                if info.in_shard and (handle.uses_sharded_strategy or first):
                    start = info.offset_in_shard
                    out.parts.setdefault(id(p), []).append(
                        Part(p, index, start, start + info.numel_in_shard, info.intra_param_start_idx)
                    )
        elif id(p) in orig:  # FSDP1, use_orig_params=True: a view into this rank's slice of the flat one
            flat, i = orig[id(p)]
            info, handle = flat._shard_param_infos[i], handles[id(flat)]
            index = out.add(names[id(p)], flat._numels[i], gi)
            if info.in_shard and p.numel() and (handle.uses_sharded_strategy or first):
                out.parts[id(p)] = [Part(p, index, 0, p.numel(), info.intra_param_start_idx)]
        elif getattr(p, "placements", None) is not None and type(p.placements[0]).__name__ == "Shard":
            index = out.add(names[id(p)], p.numel(), gi)
            rows, mine = p.shape[0], p.to_local()
            # torch.chunk's split, which FSDP2 and DTensor's Shard(0) use: ⌈rows/ranks⌉ rows a rank, in rank order
            start_row = min(p.device_mesh.get_local_rank() * math.ceil(rows / p.device_mesh.size()), rows)
            offset = start_row * (p.numel() // rows) if rows else 0
            if mine.numel():
                out.parts[id(p)] = [Part(p, index, 0, mine.numel(), offset)]
        else:  # whole on every rank: counted once
            index = out.add(names[id(p)], p.numel(), gi)
            if first and p.numel():
                out.parts[id(p)] = [Part(p, index, 0, p.numel(), 0)]
    return out


#: the columns of ``sums``: squared norms of the gradient, weight and update, ⟨−u, g⟩, counts, and 1 per part
SUMS = ("g2", "w2", "u2", "dot", "zeros", "nonfinite_grad", "nonfinite_w", "parts")


def sums(layout: Layout, parts: list[Part], rows: Tensor) -> Tensor:
    """Each user parameter's ``SUMS`` over every rank's parts: ``rows`` holds one row of ``SUMS`` per part of
    this rank's; the result, (parameters × columns) float64, is the same on every rank. A collective."""
    out = torch.zeros(len(layout.names), len(SUMS), dtype=torch.float64)
    if parts:
        out.index_add_(0, torch.tensor([part.index for part in parts]), rows.double())
    return _all_reduce(out, layout.group, dist.ReduceOp.SUM)


def _all_reduce(t: Tensor, group: Any, op: Any) -> Tensor:
    return collectives.all_reduce(t.to(collective_device(group)), op=op, group=group).cpu()


#: the kinds of effective learning rate a parameter has (``effective_lr_summaries``)
_RATE_OF_X, _CONSTANT, _TENSOR = 1.0, 2.0, 3.0


def effective_lr_summaries(
    layout: Layout, parts: list[Part], optimizer: torch.optim.Optimizer
) -> list[dict[str, float] | str | None]:
    """Each user parameter's effective learning rate as ``stats.effective_lr_summary`` gives it unsharded:
    min, median and max, or the line saying why there is none (None: no rank holds a part of it). Two
    collectives, plus two when a rate has a median to take.

    min and max are exact; the median is taken over the entries of the unsharded parameter at the positions
    ``stats.sampled`` takes (every entry up to ``stats.MEDIAN_SAMPLE``), which each rank picks from its parts,
    so it is exact too. A rate that the optimizer's own ``effective_lr`` gives in full (optiscope's RMSprop)
    is summarised over its finite entries as ``stats.summarize`` does, the sample taken before dropping
    non-finite entries (the same sample when all are finite)."""
    n = len(layout.names)
    # per parameter: the max of x (or of the rate), minus its min, the kind, and the rate's constants
    peaks = torch.full((n, 7), -math.inf, dtype=torch.float64)
    reasons: list[dict[str, float] | str | None] = [None] * n
    samples: list[list[Tensor]] = [[] for _ in range(n)]
    group_of = {id(q): g for g in optimizer.param_groups for q in g["params"]}
    for part in parts:
        rate = stats.effective_rate(optimizer, part.param, group_of[id(part.param)])
        if isinstance(rate, str):
            reasons[part.index] = rate
            continue
        if isinstance(rate, Tensor):
            values, kind, constants = part.of(rate), _TENSOR, (0.0, 0.0, 0.0, 0.0)
            values = values[torch.isfinite(values)]
        else:
            constants = (rate.scale, rate.eps, rate.divisor, float(rate.root))
            values, kind = (None, _CONSTANT) if rate.x is None else (part.of(rate.x), _RATE_OF_X)
        row = peaks[part.index]
        row[2:] = torch.tensor((kind, *constants), dtype=torch.float64)
        if values is not None and values.numel():
            lo, hi = torch.aminmax(values)
            row[0], row[1] = max(float(row[0]), float(hi)), max(float(row[1]), -float(lo))
            stride = _stride(layout.numels[part.index])
            samples[part.index].append(part.of(rate if kind == _TENSOR else rate.x)[(-part.offset) % stride :: stride])
    peaks = _all_reduce(peaks, layout.group, dist.ReduceOp.MAX)
    medians = _gathered_medians(layout, samples, peaks[:, 2])
    out: list[dict[str, float] | str | None] = []
    for i in range(n):
        hi, neg_lo, kind, scale, eps, divisor, root = peaks[i].tolist()
        if kind == -math.inf:
            out.append(reasons[i])
            continue
        rate = stats.Rate(None, scale, eps, divisor, bool(root))
        if kind == _CONSTANT:
            out.append({"min": scale, "median": scale, "max": scale})
        elif hi == -math.inf:  # no entries (or no finite ones)
            out.append({"min": math.nan, "median": math.nan, "max": math.nan})
        elif kind == _TENSOR:
            out.append({"min": -neg_lo, "median": medians[i], "max": hi})
        else:  # the rate falls as x grows
            out.append({"min": rate.at(hi), "median": rate.at(medians[i]), "max": rate.at(-neg_lo)})
    return out


def _all_gather(t: Tensor, group: Any) -> list[Tensor]:
    return [o.cpu() for o in collectives.all_gather(t.to(collective_device(group)), group=group)]


def _stride(numel: int) -> int:
    """The step between the entries ``stats.sampled`` takes of a parameter of ``numel`` entries."""
    return numel // stats.MEDIAN_SAMPLE if numel > stats.MEDIAN_SAMPLE else 1


def _gathered_medians(layout: Layout, samples: list[list[Tensor]], kinds: Tensor) -> list[float]:
    """The median of each parameter's sample, gathered from every rank: the upper one of an x (as
    ``stats.effective_lr_summary`` takes it), the lower one of a rate (``stats.summarize``). Collectives."""
    n = len(samples)
    if not any(k in (_RATE_OF_X, _TENSOR) for k in kinds.tolist()):
        return [math.nan] * n
    mine = [torch.cat(s).double() if s else torch.zeros(0, dtype=torch.float64) for s in samples]
    counts = torch.tensor([len(s) for s in mine], dtype=torch.float64)
    all_counts = _all_gather(counts, layout.group)
    flat = torch.zeros(int(max(float(c.sum()) for c in all_counts)), dtype=torch.float64)
    flat[: int(counts.sum())] = torch.cat(mine)
    blocks = _all_gather(flat, layout.group)
    pieces: list[list[Tensor]] = [[] for _ in range(n)]
    for block, c in zip(blocks, all_counts, strict=True):
        sizes = [int(x) for x in c.tolist()]
        for i, piece in enumerate(block[: sum(sizes)].split(sizes)):
            pieces[i].append(piece)
    medians = []
    for i, kind in enumerate(kinds.tolist()):
        values = torch.cat(pieces[i])
        if kind == _TENSOR:
            values = values[torch.isfinite(values)]
        if values.numel() == 0:
            medians.append(math.nan)
        else:
            k = values.numel() // 2 + 1 if kind == _RATE_OF_X else (values.numel() - 1) // 2 + 1
            medians.append(float(torch.kthvalue(values, k).values))
    return medians
