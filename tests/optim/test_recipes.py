"""The recipes: ``--optimizers`` parsing (one run per recipe and learning rate, however it is written), and
each recipe building what its description says."""

import sys

import pytest
import torch

from optiscope.errors import ConfigError
from optiscope.optim import load_recipes, recipes, register_recipe
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


# ------------------------------------------------------------------ a user's optimizer: dotted paths, recipes files
@pytest.fixture
def own_recipes(monkeypatch):
    """The registered recipes of this test alone."""
    monkeypatch.setattr(recipes, "_registered", {})


HALF_SGD = """
import torch


class HalfSGD(torch.optim.SGD):
    def __init__(self, params, lr=0.01, scale=1.0):
        super().__init__(params, lr=lr * scale / 2)
"""


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """``myopts.HalfSGD`` (SGD at η·scale/2), importable from a folder on sys.path as a user's own module is."""
    (tmp_path / "myopts.py").write_text(HALF_SGD)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "myopts.HalfSGD"
    sys.modules.pop("myopts", None)


def same_settings(built, literal):
    """Every group of ``built`` has each setting of ``literal``'s defaults."""
    return all(group[k] == v for group in built.param_groups for k, v in literal.defaults.items())


@pytest.mark.parametrize("path", ["torch.optim.NAdam", "torch.optim.RAdam", "pytorch_optimizer.SOAP"])
def test_a_dotted_path_builds_the_class_with_its_own_defaults(path):
    """torch.optim.NAdam@η is torch.optim.NAdam(params, lr=η): every other argument, λ included, the class's."""
    module, _, name = path.rpartition(".")
    cls = getattr(__import__(module, fromlist=[name]), name)
    model = torch.nn.Linear(3, 2)
    built = build_optimizer(path, model, lr=3e-3, weight_decay=0.5)
    literal = cls(model.parameters(), lr=3e-3)
    assert type(built) is cls and same_settings(built, literal)
    assert [len(g["params"]) for g in built.param_groups] == [2]


def test_a_users_module_on_the_path_is_an_optimizer_everywhere(user_module):
    specs = parse_runs(f"adam,{user_module}@0.1", DEFAULTS)
    assert [(s.label, s.optimizer, s.lr) for s in specs] == [
        ("adam", "adam", 0.01),
        (f"{user_module}@0.1", user_module, 0.1),
    ]
    theta = torch.tensor([1.0, -2.0], requires_grad=True)
    optimizer = build_optimizer(user_module, [theta], lr=0.1)
    (theta**2).sum().backward()
    optimizer.step()
    assert theta.tolist() == pytest.approx([0.9, -1.8])  # θ − (η/2)·2θ


RECIPES_FILE = """
[recipes.soap]
class = "pytorch_optimizer.SOAP"
lr = 3e-3
decays = true
options = { betas = [0.95, 0.95], precondition_frequency = 5 }

[recipes.nadam]
class = "torch.optim.NAdam"
"""


def test_a_recipes_file_builds_what_it_says(own_recipes, tmp_path):
    import pytorch_optimizer

    path = tmp_path / "recipes.toml"
    path.write_text(RECIPES_FILE)
    loaded = load_recipes(path)
    assert list(loaded) == ["soap", "nadam"]
    model = torch.nn.Linear(3, 2)
    built = build_optimizer("soap", model, lr=1e-3, weight_decay=0.2)
    # decays: λ comes from the experiment
    literal = pytorch_optimizer.SOAP(
        model.parameters(), lr=1e-3, betas=(0.95, 0.95), precondition_frequency=5, weight_decay=0.2
    )
    assert type(built) is pytorch_optimizer.SOAP and same_settings(built, literal)
    assert loaded["soap"].describe() == (
        "pytorch_optimizer.optimizer.soap.SOAP(lr=η, betas=(0.95, 0.95), precondition_frequency=5, weight_decay=λ)"
    )
    # no lr of its own: an experiment's per-optimizer table has none for it, so the run must name one
    specs = parse_runs("soap,nadam@0.002", DEFAULTS)
    assert [(s.optimizer, s.lr) for s in specs] == [("soap", 3e-3), ("nadam", 0.002)]
    with pytest.raises(recipes.NoLearningRate, match=r"'nadam' has no usual learning rate here; .* nadam@0.001"):
        parse_runs("nadam", DEFAULTS)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("nosuchpackage.Opt@0.1", r"cannot import 'nosuchpackage.Opt': no module named 'nosuchpackage'"),
        ("torch.optim.NAdamm@0.1", r"torch.optim has no 'NAdamm'; its optimizer classes: ASGD, .*NAdam, "),
        ("torch.nn.Linear@0.1", r"'torch.nn.Linear' is not a torch.optim.Optimizer subclass"),
        ("adamx@0.1", r"unknown optimizer 'adamx' in 'adamx@0.1'; valid: sgd, adam, or .* dotted path"),
    ],
)
def test_a_bad_dotted_path_is_one_line_naming_what_would_be_valid(spec, message):
    with pytest.raises(ConfigError, match=message) as refused:
        parse_runs(spec, DEFAULTS)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[recipes.adamw]\nclass = 'torch.optim.AdamW'\n", r"\[recipes.adamw\]: the name is a built-in recipe's"),
        ("[recipes.x]\nclass = 'torch.optim.NAdam'\noptions = { momentum = 0.9 }\n", "NAdam takes no momentum; it "),
        ("[recipes.x]\nclass = 'torch.optim.NAdam'\noptions = { betas = [2.0, 0.9] }\n", "cannot be built: Value"),
        ("[recipes.x]\nclass = 'torch.optim.Rprop'\ndecays = true\n", "Rprop takes no weight_decay"),
        ("[recipes.x]\nclass = 'torch.optim.NAdam'\noptions = { lr = 0.1 }\n", "options set lr, which is η"),
        ("[recipes.x]\nclass = 'nosuchpackage.Opt'\n", r"\[recipes.x\]: cannot import 'nosuchpackage.Opt'"),
        ("[recipes.x]\nclas = 'torch.optim.NAdam'\n", "unknown key 'clas'; valid: class, lr, decays, options"),
        ("[recipes.x]\nclass = 'torch.optim.NAdam'\nlr = -1\n", "lr = -1 must be a finite number > 0"),
        ("[recipes.'a.b']\nclass = 'torch.optim.NAdam'\n", r"\[recipes.a.b\]: the name must be letters, digits"),
        ("[recipes.x\nclass = 1", "is not valid TOML: "),
        ("[optimizers.x]\nclass = 'torch.optim.NAdam'\n", r"holds no \[recipes.NAME\] tables alone"),
    ],
)
def test_a_bad_recipes_file_is_one_line_and_registers_nothing(own_recipes, tmp_path, text, message):
    path = tmp_path / "recipes.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as refused:
        load_recipes(path)
    assert "\n" not in str(refused.value) and recipes._registered == {}


def test_a_recipes_file_that_is_not_there_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"--recipes '.*nothing.toml': cannot read it \(No such file"):
        load_recipes(tmp_path / "nothing.toml")


def test_a_registered_recipe_travels_as_data(own_recipes, user_module):
    """What a sweep sends its workers: a recipe as a recipes file's entry, registered again from it."""
    register_recipe("sign", recipes.Recipe(recipes.import_optimizer(user_module), {"scale": 0.5}, lr=0.1))
    data = recipes.registered(["adam", "sign"])
    assert data == {"sign": {"class": user_module, "decays": False, "options": {"scale": 0.5}, "lr": 0.1}}
    recipes._registered.clear()
    recipes.register_table(data)
    optimizer = build_optimizer("sign", [torch.zeros(2, requires_grad=True)], lr=0.2)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.2 * 0.5 / 2)  # HalfSGD with the recipe's scale
