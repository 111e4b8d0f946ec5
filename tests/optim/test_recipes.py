"""The recipes: ``--optimizers`` parsing (one run per recipe and learning rate, however it is written), and
each recipe building what its description says."""

import pytest
import torch

from optiscope.errors import ConfigError
from optiscope.optim.recipes import RECIPES, build_optimizer, parse_runs

DEFAULTS = {"sgd": 0.2, "adam": 0.01}


def test_names_with_and_without_a_learning_rate():
    specs = parse_runs("sgd, adam@0.05", DEFAULTS)
    assert [(s.label, s.optimizer, s.lr) for s in specs] == [("sgd", "sgd", 0.2), ("adam@0.05", "adam", 0.05)]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("sgd@0.1,sgd@0.1", "names a run twice: sgd@0.1, sgd@0.1"),
        ("sgd@0.2,sgd@.2", r"sgd@0.2 and sgd@.2 are one run \(sgd at lr 0.2\)"),
        ("sgd,sgd@0.2", r"sgd and sgd@0.2 are one run \(sgd at lr 0.2\)"),
        ("sgd,,adam", "has an empty item in 'sgd,,adam'"),
        ("sgd,adam,", "has an empty item"),
        ("", "--optimizers is empty"),
        ("sgd@fast", "'sgd@fast' has a learning rate 'fast' that is not a number"),
        ("lion", "unknown optimizer 'lion'; valid: sgd, adam"),
    ],
)
def test_one_run_written_twice_or_nothing_at_all_is_refused(text, message):
    with pytest.raises(ConfigError, match=message):
        parse_runs(text, DEFAULTS)


@pytest.mark.parametrize("name", [n for n, r in RECIPES.items() if not r.splits_model])
def test_a_recipe_builds_what_its_description_says(name):
    """describe() is what results.json and legends show: the optimizer it names, built literally (class,
    lr=η, the options shown, every other argument the class's default), must have the built groups' settings."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4, bias=False), torch.nn.Linear(4, 2, bias=False))
    rule = RECIPES[name]
    described = rule.describe()
    assert described.startswith(f"{rule.cls.__name__}(lr=η")
    literal = rule.cls(model.parameters(), lr=0.01, **rule.options)
    built = build_optimizer(name, model, lr=0.01, weight_decay=0.0 if rule.decays else 0.3)
    for group in built.param_groups:
        for key, value in literal.defaults.items():
            if rule.decays and key == "weight_decay":
                continue  # λ comes from the experiment ("weight_decay=λ" in the description)
            assert group[key] == value, (name, key, described)


def test_muon_with_adamw_builds_what_its_description_says():
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)
    )
    described = RECIPES["muon+adamw"].describe()
    assert described == (
        "Muon(lr=η, weight_decay=0) on hidden matrices + AdamW(lr=η/20, betas=(0.9, 0.95), weight_decay=0) on the rest"
    )
    muon, adamw = (
        [g for g in build_optimizer("muon+adamw", model, lr=0.02).param_groups if g["use_muon"] is flag]
        for flag in (True, False)
    )
    assert all(g["lr"] == 0.02 and g["weight_decay"] == 0 for g in muon)
    assert all(g["lr"] == 0.001 and g["betas"] == (0.9, 0.95) and g["weight_decay"] == 0 for g in adamw)
