"""optiscope.probe: what one optimizer step does to a model, predicted and measured.

``update_direction`` gives v = Δθ/η for an optimizer's next step without taking it; ``probe_step``
compares the true change of the mean next-token entropy (or loss) at θ + ηv over a grid of η with the
linear prediction η·∇H·v and the quadratic one η·∇H·v + ½η²·vᵀ∇²H v.
"""

from .direction import update_direction
from .functionals import entropy_per_sequence, loss_per_sequence
from .probe import prediction_curves, probe_step, sample_sequences, subset_errors

__all__ = [
    "update_direction",
    "probe_step",
    "sample_sequences",
    "entropy_per_sequence",
    "loss_per_sequence",
    "prediction_curves",
    "subset_errors",
]
