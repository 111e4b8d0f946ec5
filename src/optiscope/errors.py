"""What the user got wrong, told apart from what went wrong inside optiscope.

``UserError`` is the base of every error that bad input causes: a bad option, a missing or unreadable
file, a run directory that may not be used. Its message names the bad value and what would be valid;
the command line prints it as one line and exits 2. Any other exception escaping a command is an
internal error (exit 1, traceback saved), never reported as bad input.
"""


class UserError(Exception):
    """Bad input: the message names the value and what would be valid."""


class ConfigError(UserError, ValueError):
    """A bad setting of an experiment or of a run; the message names the value and what would be valid.

    A ``UserError`` (bad input: the command line prints it as one line and exits 2) and a ``ValueError``.
    Experiments' ``Config`` classes raise it from ``__post_init__``; ``load``, ``objectives``, ``only_run`` and
    ``optiscope.sweep.run_sweep`` raise it for a name or setting that is not valid.

    Examples:
        >>> from optiscope import experiments
        >>> try:
        ...     experiments.load("landscape")
        ... except experiments.ConfigError as e:
        ...     print(e)
        unknown experiment 'landscape'; valid experiments: adder, edge-of-stability, ...
        >>> issubclass(experiments.ConfigError, ValueError)
        True
    """


class SuggestionError(UserError, ValueError):
    """Input from which no learning rate can be suggested; the message names it and what would do.

    A ``UserError`` (bad input: the command line prints it as one line and exits 2) and a ``ValueError``.
    [`suggest_lr`][optiscope.suggest.suggest_lr] raises it for batches that give none, an optimizer whose groups
    hold no lr, a loss that is not finite at the first probe step, and too few steps for one measurement (the
    message says the least that works).

    Examples:
        >>> from optiscope.errors import SuggestionError
        >>> issubclass(SuggestionError, ValueError)
        True
    """
