"""optiscope.optim: readable optimizers, verified against torch.optim and NumPy twins.

Every optimizer is a ``torch.optim.Optimizer`` (param groups, ``state_dict``, hooks, lr schedulers)
with a for-loop path (the ground truth), a foreach path and, where torch has the kernel, a fused path.
Adam-family optimizers (and RMSprop) report their per-element effective learning rate with
``optimizer.effective_lr(param)``. ``RECIPES`` names the settings every experiment compares, and
``build_optimizer(name, model, lr)`` builds one, or any ``torch.optim.Optimizer`` subclass by its dotted path;
``register_recipe`` and ``load_recipes`` (a TOML file) name a user's own.
"""

from .adam import Adam, AdamL2, AdamW
from .clip import NonFiniteGradientError, clip_grad_norm
from .lion import Lion
from .muon import Muon, MuonWithAdamW, muon_with_adamw, newton_schulz, split_params_for_muon
from .optimizer import OptiscopeOptimizer
from .recipes import RECIPES, Recipe, build_optimizer, load_recipes, register_recipe
from .rmsprop import RMSprop
from .schedules import Schedule, as_lambda_lr, constant, cosine, linear_warmup, warmup_cosine
from .sgd import SGD

__all__ = [
    "SGD",
    "RMSprop",
    "Adam",
    "AdamW",
    "AdamL2",
    "Lion",
    "Muon",
    "MuonWithAdamW",
    "OptiscopeOptimizer",
    "RECIPES",
    "Recipe",
    "build_optimizer",
    "register_recipe",
    "load_recipes",
    "muon_with_adamw",
    "split_params_for_muon",
    "newton_schulz",
    "clip_grad_norm",
    "NonFiniteGradientError",
    "Schedule",
    "constant",
    "linear_warmup",
    "cosine",
    "warmup_cosine",
    "as_lambda_lr",
]
