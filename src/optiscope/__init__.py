"""optiscope: a PyTorch laboratory for optimizers.

Optimizers make updates (``optiscope.optim``); instruments measure updates (``optiscope.monitor``);
experiments produce data (``optiscope.experiments``); figures draw data (``optiscope.figures``).
"""

__version__ = "0.1.0"
