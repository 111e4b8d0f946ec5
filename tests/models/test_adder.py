"""The adder model family against a naive row-major re-implementation, and its parameter counting."""

import dataclasses
import json
import math

import pytest
import torch
import torch.nn.functional as F

from optiscope.data.addition import SEQ_LEN
from optiscope.models.adder import AdderConfig, AdderModel, count_parameters, parameter_budget, rotate_planes

CONFIGS = {
    "default": AdderConfig(),
    "two-heads": AdderConfig(n_heads=2, qk_dim=3, attn_rank=2, ffn_width=4, ffn_bias=True, norm="shared"),
    "table-learned": AdderConfig(
        tok_dim=3,
        pos_dim=4,
        token_embedding="table",
        positions="learned",
        qk_source="all",
        shared_qk=False,
        v_source="all",
        norm="separate",
        ffn_width=6,
    ),  # fmt: skip
    "no-phase-unit-norm": AdderConfig(q_phase="none", qk_source="tok", norm="unit", qk_dim=2),
    "heads-share-qk": AdderConfig(
        n_heads=3,
        qk_per_head=False,
        q_phase="frozen",
        turn=11,
        learned_points=False,
        shared_qk=False,
        ffn_bias=True,
        norm="shared",
    ),
}


def rotation_matrix(theta: float, dim: int) -> torch.Tensor:
    c, s = math.cos(theta), math.sin(theta)
    blocks = [torch.tensor([[c, -s], [s, c]])] * (dim // 2) + [torch.ones(1, 1)] * (dim % 2)
    return torch.block_diag(*blocks)


def reference_logits(model: AdderModel, tokens: torch.Tensor) -> torch.Tensor:
    """The model's maths written out one sequence at a time, row-major, with explicit matrices."""
    cfg = model.cfg
    table, pos_table, digits = model.token.table(), model.positions.table(), model.token.digits()
    att = model.attention
    tok = cfg.tok_dim

    def norm(v, site):
        if cfg.norm == "none":
            return v
        v = v / torch.sqrt((v * v).mean(-1, keepdim=True) + 1e-5)
        if cfg.norm == "shared":
            return v * model.norm.weight[0]
        return v * model.norm.weight[site] if cfg.norm == "separate" else v

    def part(v, source):
        return {"pos": v[:, tok:], "tok": v[:, :tok], "all": v}[source]

    out = []
    for seq in tokens:
        t = len(seq)
        x = torch.stack([torch.cat([table[k], pos_table[i]]) for i, k in enumerate(seq.tolist())])
        a = norm(x, 0)
        update = torch.zeros_like(x)
        for h in range(cfg.n_heads):
            src = pos_table[:t] if cfg.qk_source == "pos" else part(a, cfg.qk_source)
            g = h if cfg.qk_per_head else 0  # heads may share one W
            q = src @ att.query[g].T
            k = src @ (att.query if att.key is None else att.key)[g].T
            if att.phase is not None:
                q = q @ rotation_matrix(float(att.phase[h].detach()), cfg.qk_dim).T
            scores = q @ k.T / math.sqrt(cfg.qk_dim)
            scores = scores.masked_fill(torch.ones(t, t).triu(1).bool(), float("-inf"))
            update = update + scores.softmax(-1) @ (part(a, cfg.v_source) @ att.value[h].T) @ att.output[h].T
        x = x + update
        x = x + F.linear(
            F.gelu(F.linear(norm(x, 1), model.up.weight, model.up.bias)), model.down.weight, model.down.bias
        )
        out.append(norm(x, 2) @ model.head.weight.T @ digits.T)
    return torch.stack(out)


def perturbed(cfg: AdderConfig, seed: int = 0) -> AdderModel:
    """A model with every parameter moved off its initial value (norm weights and biases included)."""
    torch.manual_seed(seed)
    model = AdderModel(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("name", CONFIGS)
def test_forward_matches_the_naive_reference(name):
    model = perturbed(CONFIGS[name])
    tokens = torch.randint(0, 12, (3, SEQ_LEN), generator=torch.Generator().manual_seed(1))
    expected = reference_logits(model, tokens)
    assert model(tokens).shape == (3, SEQ_LEN, 10)
    torch.testing.assert_close(model(tokens), expected, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(model(tokens[:, :23]), expected[:, :23], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(model.scores(tokens, 11).permute(1, 2, 0), expected[:, -11:], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", CONFIGS)
def test_causal(name):
    model = perturbed(CONFIGS[name], seed=2)
    tokens = torch.randint(0, 12, (2, SEQ_LEN))
    changed = tokens.clone()
    changed[:, 20:] = (changed[:, 20:] + 1) % 12
    torch.testing.assert_close(model(tokens)[:, :20], model(changed)[:, :20])


def test_attention_pattern_is_causal_and_position_only():
    model = perturbed(CONFIGS["default"])
    pattern = model.attention_pattern(torch.randint(0, 12, (4, SEQ_LEN)))
    assert pattern.shape == (1, 1, SEQ_LEN, SEQ_LEN)  # one pattern serves every sequence
    torch.testing.assert_close(pattern.sum(-1), torch.ones(1, 1, SEQ_LEN))
    assert (pattern[0, 0].triu(1) == 0).all()
    per_example = perturbed(CONFIGS["table-learned"]).attention_pattern(torch.randint(0, 12, (4, SEQ_LEN)))
    assert per_example.shape == (1, 4, SEQ_LEN, SEQ_LEN)


def test_rotate_planes_against_rotation_matrices():
    q = torch.randn(2, 5, 7)  # (heads, qk, positions)
    theta = torch.tensor([0.4, -1.1])
    turned = rotate_planes(q, theta)
    for h in range(2):
        torch.testing.assert_close(turned[h], rotation_matrix(float(theta[h]), 5) @ q[h])


def test_parameter_count_by_hand():
    # default: arc r, α, δ (3) + EQUALS, CARRY (3 + 3) + query 4×3 (12) + phase (1) + value 1×2 (2)
    # + output 5×1 (5) + FFN 2×5 + 5×2 (20) + head 2×5 (10); the spiral buffer is free
    assert count_parameters(AdderModel(CONFIGS["default"])) == 3 + 6 + 12 + 1 + 2 + 5 + 20 + 10 == 59
    # table-learned: table 12×3 + positions 32×4 + query, key 4×7 each + phase + value 1×7 + output 7×1
    # + norms 3×7 + FFN (7×6 + 6×7) + head 3×7
    expected = 36 + 128 + 2 * 28 + 1 + 7 + 7 + 21 + 84 + 21
    assert count_parameters(AdderModel(CONFIGS["table-learned"])) == expected


def test_budget_rows_add_up_and_frozen_buffers_are_free():
    for cfg in CONFIGS.values():
        model = AdderModel(cfg)
        rows = parameter_budget(model)
        assert sum(r["params"] for r in rows) == count_parameters(model)
        assert len({r["name"] for r in rows}) == len(rows)
    rows = {r["name"]: r for r in parameter_budget(AdderModel(AdderConfig()))}
    assert rows["positions.spiral"]["params"] == 0 and rows["positions.spiral"]["shape"] == [10, 3]
    assert rows["attention.query"] == {
        "name": "attention.query",
        "component": "attention",
        "shape": [1, 4, 3],
        "params": 12,
    }
    assert "attention.causal" not in rows


def test_frozen_and_tied_tensors_count_once_or_not_at_all():
    model = AdderModel(AdderConfig(token_embedding="table"))
    n = count_parameters(model)
    model.extra = torch.nn.ParameterList([model.token.weight])  # the same tensor used a second time
    assert count_parameters(model) == n
    model.head.weight.requires_grad_(False)
    assert count_parameters(model) == n - 10


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(token_embedding="onehot"), "token_embedding='onehot'; valid: arc, table"),
        (dict(tok_dim=3), "tok_dim=3 needs 'table'"),
        (dict(pos_dim=4), "pos_dim=4 needs positions='learned'"),
        (dict(ffn_width=0), "ffn_width=0 must be an integer >= 1"),
        (dict(norm="layer"), "norm='layer'; valid: none, unit, shared, separate"),
    ],
)
def test_bad_config_names_the_value(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        AdderConfig(**kwargs)


def test_config_round_trips_through_json_types():
    cfg = CONFIGS["two-heads"]
    assert AdderConfig.from_dict(json.loads(json.dumps(dataclasses.asdict(cfg)))) == cfg


def test_spiral_layout():
    cfg = AdderConfig(spiral=(2.0, 0.3, 0.1, -0.5), turn=11, learned_points=False)
    table = AdderModel(cfg).positions.table()

    def point(i):
        angle = 2 * math.pi * i / 11 + 0.3
        return torch.tensor([2 * math.cos(angle), 2 * math.sin(angle), 0.1 * i - 0.5])

    for i in range(10):
        torch.testing.assert_close(table[i], point(i))  # x_i
        torch.testing.assert_close(table[11 + i], point(i))  # y_i
        torch.testing.assert_close(table[22 + i], point(i))  # z_i (z9: the CARRY slot starts at place 9)
    assert (table[10] == 0).all()  # PLUS
    torch.testing.assert_close(table[21], point(-1))  # EQUALS: place -1
    assert count_parameters(AdderModel(cfg)) == count_parameters(AdderModel(AdderConfig(turn=11))) - 6
