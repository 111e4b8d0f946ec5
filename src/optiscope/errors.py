"""What the user got wrong, told apart from what went wrong inside optiscope.

``UserError`` is the base of every error that bad input causes: a bad option, a missing or unreadable
file, a run directory that may not be used. Its message names the bad value and what would be valid;
the command line prints it as one line and exits 2. Any other exception escaping a command is an
internal error (exit 1, traceback saved), never reported as bad input.
"""


class UserError(Exception):
    """Bad input: the message names the value and what would be valid."""


class ConfigError(UserError, ValueError):
    """A bad setting of an experiment or of a run; the message names the value and what would be valid."""
