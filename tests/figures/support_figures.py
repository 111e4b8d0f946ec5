"""Checks every figure test makes: the PNG opens, has a sane size, is not blank, and redraws identically."""

from pathlib import Path

import matplotlib.image as mpimg
import numpy as np


def assert_real_png(path: Path, min_width: int = 600, min_height: int = 300) -> None:
    image = mpimg.imread(path)
    height, width = image.shape[:2]
    assert width >= min_width and height >= min_height, f"{path.name}: {width}x{height}"
    rgb = image[..., :3]
    # not blank: a figure has ink, and more than a couple of colours
    assert rgb.std() > 0.02, f"{path.name} looks blank"
    assert len(np.unique((rgb * 255).astype(np.uint8).reshape(-1, 3), axis=0)) > 8


def assert_redraws_identically(draw, results, tmp_path: Path) -> list[Path]:
    first = draw(results, tmp_path / "a")
    second = draw(results, tmp_path / "b")
    for a, b in zip(first, second, strict=True):
        assert a.read_bytes() == b.read_bytes(), f"{a.name} differs between two draws"
        assert_real_png(a)
    return first
