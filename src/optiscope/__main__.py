"""``python -m optiscope`` (and ``torchrun -m optiscope``) and the ``optiscope`` command run the command-line
interface."""

import sys


def main() -> int:
    """The CLI. A Ctrl-C while torch and the rest are still being imported ends in one line (exit 130), not a
    traceback from inside an import: nothing had started."""
    try:
        from .cli import main as cli_main
    except KeyboardInterrupt:
        print("optiscope: interrupted while starting; nothing was run", file=sys.stderr, flush=True)
        return 130
    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
