"""NumPy reference twins of optiscope's optimizers, over the seed's ``{"params", "grad"}`` contract."""

from .optimizers import SGD, Adam, AdamL2, AdamW, Lion, Muon, Optimizer, RMSProp, newton_schulz

__all__ = ["SGD", "Adam", "AdamL2", "AdamW", "Lion", "Muon", "Optimizer", "RMSProp", "newton_schulz"]
