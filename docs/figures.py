"""Make the experiment pages' figures from real runs.

The figures in ``docs/assets/figures/`` were made with::

    nice -n 10 .venv/bin/python docs/figures.py --keep /tmp/optiscope-figures

run from the repository root on the 2-core development machine (torch 2.13, CPU, shared with other work), and
redrawn from those runs' results, without training again, with::

    .venv/bin/python docs/figures.py --replot /tmp/optiscope-figures

(``optiscope plot`` on each kept run, then the same copy).

Each experiment runs, one at a time, through the ``optiscope`` command line into its own folder (under
``--keep``, or else a temporary folder deleted at the end); ``docs/figures.py rare-tokens lm`` redoes only
those. The chosen PNGs are copied to ``docs/assets/figures/<experiment>-<figure>.png`` at the same size in
pixels, as optimised PNGs of 256 colours, to keep the site's figures small. The Home page and the README show
``rare-tokens-sgd_vs_adam.png``.

``zoo-sweep`` and ``zoo-landscapes`` are the [zoo](experiments/zoo.md) page's runs: the tuned sweep of five
optimizers of pytorch-optimizer against AdamW and Muon + AdamW (94 trials, 52 minutes of trial time, 27 minutes
wall-clock with 2 workers, the machine shared with other work) and the landscapes of the same optimizers.

Every experiment runs with its defaults (``lm`` took 44 minutes there, the machine shared with other work,
``adder`` 2.5) but ``entropy``, whose default run trains its own GPT for about 20 minutes: it runs with
``--quick``, and its page says under the figure that it is from the ``--quick`` run while the numbers in the
text are from the default run.
"""

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from PIL import Image
from PIL.PngImagePlugin import PngInfo

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "assets" / "figures"

# experiment -> (extra options, figures to keep); --threads 1 where the experiment has it
EXPERIMENTS = {
    "rare-tokens": ([], ["sgd_vs_adam", "optimizers", "lr_sweep"]),
    "landscapes": ([], ["landscapes", "bias_correction", "adamw_vs_adaml2"]),
    "lm": ([], ["lm_loss", "lm_embedding_rows"]),
    "entropy": (["--quick"], ["entropy_delta_vs_eta_aggregate", "entropy_loglog"]),
    "adder": (["--threads", "1"], ["adder_explainer", "adder_training"]),
    "edge-of-stability": (["--threads", "1"], ["sharpness", "preconditioned"]),
    "mlp": (["--threads", "1"], ["mlp_curves"]),
}

# the zoo page's runs: name -> (the command after `optiscope`, without --out; figures to keep)
ZOO = "docs/experiments/zoo.toml"
ZOO_OPTIMIZERS = "soap,schedule-free-adamw,ademamix,prodigy,adopt"
COMMANDS = {
    **{name: (["run", name, "--quiet", *options], figures) for name, (options, figures) in EXPERIMENTS.items()},
    "zoo-sweep": (
        ["sweep", "lm", "--recipes", ZOO, "--optimizers", f"adamw,muon+adamw,{ZOO_OPTIMIZERS}", "--quick"]
        + ["--steps", "400", "--eval-every", "50", "--warmup-steps", "40", "--sample-tokens", "0", "--workers", "2"],
        ["sweep_tuned", "sweep_sensitivity"],
    ),
    "zoo-landscapes": (
        ["run", "landscapes", "--quiet", "--recipes", ZOO, "--optimizers", f"adamw,{ZOO_OPTIMIZERS}"],
        ["landscapes", "convergence_table"],
    ),
}


def make(name: str, scratch: Path, replot: bool = False) -> None:
    """Run one experiment into ``scratch`` (or, with ``replot``, redraw the figures of the run kept there) and
    copy its chosen figures into ``docs/assets/figures``."""
    arguments, figures = COMMANDS[name]
    out = scratch / name
    if replot:
        command = [sys.executable, "-m", "optiscope", "plot", str(out)]
    else:
        command = [sys.executable, "-m", "optiscope", *arguments, "--out", str(out), "--force"]
    print("$", " ".join(command[1:]), flush=True)
    start = time.monotonic()
    # exit code 3 (every run diverged) still leaves figures; anything else is a failure
    done = subprocess.run(command, cwd=ROOT, check=False, stdout=subprocess.DEVNULL if replot else None)
    if done.returncode not in (0, 3):
        raise SystemExit(f"{name}: exit code {done.returncode}")
    print(f"  {time.monotonic() - start:.0f} s", flush=True)
    OUT.mkdir(parents=True, exist_ok=True)
    for figure in figures:
        target = OUT / f"{name}-{figure}.png"
        with Image.open(out / "figures" / f"{figure}.png") as image:
            # the figure's record of its smallest font goes with it: the site's test reads it
            info = PngInfo()
            for key, value in image.text.items():
                info.add_text(key, value)
            # the figures are opaque and drawn in few colours: 256 of them, undithered, look the same at a
            # third of the size (scaling down would add anti-aliased colours and grow the file instead)
            image = image.convert("RGB").quantize(256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
            image.save(target, optimize=True, pnginfo=info)
        print(f"  {target.relative_to(ROOT)}: {target.stat().st_size / 1024:.0f} KB", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("experiments", nargs="*", help=f"some of {', '.join(COMMANDS)} (default: all)")
    parser.add_argument("--keep", help="run into this folder and keep it (default: a temporary folder)")
    parser.add_argument("--replot", metavar="DIR", help="redraw the figures of the runs kept in DIR; train nothing")
    args = parser.parse_args()
    unknown = [name for name in args.experiments if name not in COMMANDS]
    if unknown:
        parser.error(f"unknown experiments {unknown}; valid: {', '.join(COMMANDS)}")
    args.experiments = args.experiments or list(COMMANDS)
    if args.replot:
        for name in args.experiments:
            make(name, Path(args.replot), replot=True)
    elif args.keep:
        Path(args.keep).mkdir(parents=True, exist_ok=True)
        for name in args.experiments:
            make(name, Path(args.keep))
    else:
        with tempfile.TemporaryDirectory() as scratch:
            for name in args.experiments:
                make(name, Path(scratch))
    total = sum(p.stat().st_size for p in OUT.glob("*.png"))
    print(f"docs/assets/figures: {total / 2**20:.2f} MB")


if __name__ == "__main__":
    main()
