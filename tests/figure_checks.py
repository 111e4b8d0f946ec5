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


def text_boxes(fig) -> list[tuple[str, object, object]]:
    """(what, window extent, clip box or None) of every shown text of ``fig``: titles, axis labels, tick labels,
    annotations and legends (a legend is one box: its entries are laid out by matplotlib inside it)."""
    from matplotlib.legend import Legend
    from matplotlib.table import Table
    from matplotlib.text import Text

    fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()
    # a table cell's text must fit its cell (matplotlib lets it run over the edges); findobj does not reach it
    cells = {id(c.get_text()): c for t in fig.findobj(Table) for c in t.get_celld().values()}
    legends = [a for a in fig.findobj(Legend) if a.get_visible()]
    inside = {id(t) for legend in legends for t in legend.findobj(Text)}
    ticks, drawn = set(), set()
    for ax in fig.axes:
        for axis in ax._axis_map.values():
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                ticks |= {id(tick.label1), id(tick.label2)}
            if ax.axison and axis.get_visible() and getattr(ax, "name", "") != "3d":
                # the ticks drawn: those in the view (a 3-D panel's follow its projection, matplotlib's business)
                drawn |= {id(t.label1) for t in axis._update_ticks()} | {id(t.label2) for t in axis._update_ticks()}
    boxes = []
    for legend in legends:
        boxes.append((f"legend {[t.get_text() for t in legend.get_texts()]}", legend.get_window_extent(renderer), None))
    texts = [t for t in fig.findobj(Text) if id(t) not in cells] + [c.get_text() for c in cells.values()]
    for text in texts:
        if id(text) in inside or not text.get_visible() or not text.get_text().strip():
            continue
        if id(text) in ticks and id(text) not in drawn:
            continue
        cell = cells.get(id(text))
        clip = cell.get_window_extent(renderer) if cell else text.get_clip_box() if text.get_clip_on() else None
        boxes.append((repr(text.get_text()), text.get_window_extent(renderer), clip))
    return boxes


def overlaps(fig, slack: float = 1.0) -> list[str]:
    """Descriptions of the text boxes of ``fig`` that overlap one another by more than ``slack`` pixels each way,
    and of those that a clip box (their panel, their table cell) cuts: the oracle is matplotlib's renderer extents.
    A text beyond the figure's edge is not cut: ``style.save`` widens the PNG to hold it (``bbox_inches="tight"``)."""
    from matplotlib.transforms import Bbox

    boxes = text_boxes(fig)
    found = []
    for what, box, clip in boxes:
        if clip is not None and Bbox.intersection(box, clip) != box:
            inter = Bbox.intersection(box, clip)
            if inter is None or inter.width < box.width - slack or inter.height < box.height - slack:
                found.append(f"{what} is cut by its panel's edge")
    for i, (a, box_a, _) in enumerate(boxes):
        for b, box_b, _ in boxes[i + 1 :]:
            inter = Bbox.intersection(box_a, box_b)
            if inter is not None and inter.width > slack and inter.height > slack:
                found.append(f"{a} overlaps {b}")
    return found
