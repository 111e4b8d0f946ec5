"""An optimizer class without a learning rate, importable by its dotted path (``suggest.no_lr.Sign``)."""

import torch


class Sign(torch.optim.Optimizer):
    """θ ← θ − sign(g) · 1e-3: no lr to suggest."""

    def __init__(self, params):
        super().__init__(params, {})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad.sign(), alpha=-1e-3)
