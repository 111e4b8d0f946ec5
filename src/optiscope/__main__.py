"""``python -m optiscope`` (and ``torchrun -m optiscope``) runs the command-line interface."""

import sys

from .cli import main

sys.exit(main())
