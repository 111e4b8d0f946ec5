"""``python -m optiscope`` (and ``torchrun -m optiscope``) and the ``optiscope`` command run the command-line
interface."""

import signal
import sys
import threading

STARTING = "optiscope: interrupted while starting; nothing was run"


def main() -> int:
    """The CLI. A Ctrl-C while torch and the rest are still being imported ends in one line (exit 130), not a
    traceback from inside an import: nothing had started.

    The Ctrl-C is only noted while importing and acted on after: raised inside an import, it can be swallowed
    half-way (torch's import of NumPy does), leaving a module half-imported that fails later with a
    RecursionError, or the Ctrl-C ignored altogether."""
    interrupted: list[int] = []
    own = threading.current_thread() is threading.main_thread()  # only the main thread may set a handler
    previous = signal.signal(signal.SIGINT, lambda signum, frame: interrupted.append(signum)) if own else None
    try:
        from .cli import main as cli_main
    except KeyboardInterrupt:
        interrupted.append(signal.SIGINT)
    finally:
        if own:
            signal.signal(signal.SIGINT, previous)
    if interrupted:
        print(STARTING, file=sys.stderr, flush=True)
        return 130
    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
