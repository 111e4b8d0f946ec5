"""Checks that a figure file is a real, drawn PNG, and that redrawing it gives the same bytes."""

from __future__ import annotations

from pathlib import Path

import matplotlib.image
import numpy as np


def assert_drawn_png(path: Path, min_width: int = 800, min_height: int = 500) -> None:
    """``path`` opens as a PNG of at least the given size whose pixels are not one flat colour."""
    assert Path(path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    pixels = matplotlib.image.imread(path)
    height, width = pixels.shape[:2]
    assert width >= min_width and height >= min_height, f"{path}: {width}x{height} is too small"
    rgb = pixels[..., :3].reshape(-1, 3)
    levels = np.round(rgb * 255).astype(np.int64)
    colours = np.unique((levels[:, 0] << 16) | (levels[:, 1] << 8) | levels[:, 2])
    assert len(colours) > 50, f"{path}: only {len(colours)} colours, the figure looks blank"
    background = np.median(rgb, axis=0)
    inked = np.abs(rgb - background).max(axis=1) > 0.1
    assert inked.mean() > 0.01, f"{path}: only {inked.mean():.2%} of the pixels differ from the background"


def assert_figures_drawn_and_replotted(run_dir: Path, names: list[str]) -> None:
    """``run_dir/figures`` holds exactly the PNGs ``names``, each drawn, and ``optiscope plot`` redraws
    them from results.json with the same bytes."""
    from optiscope import cli

    paths = sorted((Path(run_dir) / "figures").glob("*.png"))
    assert [p.name for p in paths] == sorted(names)
    for path in paths:
        assert_drawn_png(path)
    before = {p.name: p.read_bytes() for p in paths}
    for path in paths:
        path.unlink()
    assert cli.main(["plot", str(run_dir)]) == 0
    assert {p.name: p.read_bytes() for p in sorted((Path(run_dir) / "figures").glob("*.png"))} == before


def printed(capsys) -> str:
    """What the command printed (stdout, then stderr), with any line wrapping undone."""
    captured = capsys.readouterr()
    return " ".join((captured.out + captured.err).split())
