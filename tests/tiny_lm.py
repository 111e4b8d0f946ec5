"""A tiny causal language model and a trained-a-little optimizer, for probe tests."""

import torch
from torch import nn

from optiscope.optim import AdamW

VOCAB, WIDTH, T, E = 7, 6, 5, 9


class TinyCausalLM(nn.Module):
    """Embedding → causal running mean of the prefix → MLP → logits. Small, smooth and causal."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.mix = nn.Linear(2 * WIDTH, WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, idx):
        h = self.embed(idx)
        prefix = h.cumsum(1) / torch.arange(1, idx.shape[1] + 1, dtype=h.dtype, device=h.device).view(1, -1, 1)
        return self.head(torch.tanh(self.mix(torch.cat([h, prefix], -1))))


def setup(seed=0, optimizer="adamw"):
    torch.manual_seed(seed)
    model = TinyCausalLM().double()
    data = torch.randint(0, VOCAB, (E, T + 1))
    batch = torch.randint(0, VOCAB, (8, T + 1))
    opt = {"adamw": lambda ps: AdamW(ps, lr=1e-2), "sgd": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9)}[
        optimizer
    ](model.parameters())
    for _ in range(3):  # give the optimizer some state
        opt.zero_grad()
        lm_loss(model, batch).backward()
        opt.step()
    return model, opt, data, batch


def give_state(model, opt, loss_fn, batch, steps=2, set_to_none=True):
    """``steps`` optimizer steps on ``loss_fn(model, batch)``, the gradients zeroed after as a loop zeroes them
    before its next batch: an optimizer with state, ready to be probed."""
    for _ in range(steps):
        opt.zero_grad(set_to_none=set_to_none)
        loss_fn(model, batch).backward()
        opt.step()
    opt.zero_grad(set_to_none=set_to_none)


def lm_loss(model, batch):
    logits = model(batch[:, :-1])
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))


class CountingLM(nn.Module):
    """The tiny LM with a buffer its forward pass updates in place: the number of calls."""

    def __init__(self):
        super().__init__()
        self.lm = TinyCausalLM()
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, idx):
        self.calls += 1
        return self.lm(idx)
