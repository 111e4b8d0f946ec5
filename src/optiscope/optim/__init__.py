"""optiscope.optim: readable optimizers, verified against torch.optim and NumPy twins.

Every optimizer is a ``torch.optim.Optimizer`` (param groups, ``state_dict``, hooks, lr schedulers)
with a for-loop path (the ground truth), a foreach path and, where torch has the kernel, a fused path.
Adam-family optimizers (and RMSprop) report their per-element effective learning rate with
``optimizer.effective_lr(param)``. ``RECIPES`` names the settings every experiment compares, and
``build_optimizer(name, model, lr)`` builds one.
"""

from .adam import Adam, AdamL2, AdamW
from .clip import NonFiniteGradientError, clip_grad_norm
from .lion import Lion
from .muon import Muon, MuonWithAdamW, muon_with_adamw, newton_schulz, split_params_for_muon
from .optimizer import OptiscopeOptimizer
from .recipes import RECIPES, Recipe, RunSpec, build_optimizer, parse_runs
from .rmsprop import RMSprop
from .schedules import Schedule, as_lambda_lr, constant, cosine, linear_warmup, warmup_cosine
from .sgd import SGD

__all__ = [
    "SGD",
    "Adam",
    "AdamL2",
    "AdamW",
    "Lion",
    "Muon",
    "MuonWithAdamW",
    "NonFiniteGradientError",
    "OptiscopeOptimizer",
    "RECIPES",
    "Recipe",
    "RMSprop",
    "RunSpec",
    "Schedule",
    "as_lambda_lr",
    "build_optimizer",
    "clip_grad_norm",
    "constant",
    "cosine",
    "linear_warmup",
    "muon_with_adamw",
    "parse_runs",
    "newton_schulz",
    "split_params_for_muon",
    "warmup_cosine",
]
