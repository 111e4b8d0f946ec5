"""optiscope: a PyTorch laboratory for optimizers.

Optimizers make updates (``optiscope.optim``); instruments measure updates (``optiscope.monitor``,
``optiscope.curvature``, ``optiscope.probe``); experiments produce data (``optiscope.experiments``);
figures draw data (``optiscope.figures``). The names people reach for first are also here, at the top.
"""

__version__ = "0.2.0"

# after __version__: the subpackages read it while they load
from .curvature import sharpness, stability_threshold  # noqa: E402
from .monitor import Curvature, Monitor  # noqa: E402
from .optim import RECIPES, build_optimizer  # noqa: E402
from .probe import probe_step, update_direction  # noqa: E402

__all__ = [
    "Monitor",
    "Curvature",
    "build_optimizer",
    "RECIPES",
    "sharpness",
    "stability_threshold",
    "update_direction",
    "probe_step",
]
