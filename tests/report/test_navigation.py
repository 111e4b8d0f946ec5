"""Finding one's way in the report of every tiny run, in Chromium: the table of contents and the summary link to
what they name and land there, one loss chart per section holds every loss series, a run's per-parameter charts
are folded away and drawn when opened, a figure opens at its natural size, the page fits a 1,400 px screen and
stays small. Oracles: the run directories on disk (results.json, metrics.jsonl, the PNG files read by Pillow)."""

from __future__ import annotations

import base64
import io
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from optiscope import runs

from .browser import load, unfold

CONTENTS = "() => [...document.querySelectorAll('#toc a')].map(a => [a.getAttribute('href'), a.textContent])"

LANDED = """(target) => {
  const box = document.querySelector(target).getBoundingClientRect(), root = document.documentElement;
  return {top: box.top, bottom: box.bottom, height: innerHeight, hash: location.hash,
          atEnd: scrollY >= root.scrollHeight - innerHeight - 1};
}"""


def test_the_contents_name_every_study_and_run_and_each_link_lands_on_its_target(shown, page_runs):
    page = shown
    entries = page.evaluate(CONTENTS)
    texts = [text for _, text in entries]
    assert set(page_runs) <= set(texts), texts  # a study each (one directory each: its run entry too)
    targets = {href.removeprefix("#") for href, _ in entries}
    anchored = page.evaluate("() => [...document.querySelectorAll('section[id], article[id]')].map(e => e.id)")
    assert len(anchored) == 2 * len(page_runs) and set(anchored) <= targets, (anchored, targets)
    for href, text in entries:
        page.locator(f'#toc a[href="{href}"]').click()
        landed = page.evaluate(LANDED, href)
        assert landed["hash"] == href, (href, landed)
        # its top at the window's top, or, for a target near the page's end, shown with the page scrolled to its end
        assert 0 <= landed["top"] <= 20 or (landed["atEnd"] and 0 <= landed["top"] < landed["height"]), (text, landed)
    assert page.errors == [] and page.external == []


def test_the_contents_stay_in_view_on_a_wide_screen_and_work_on_a_narrow_one(shown):
    page = shown
    page.locator('#toc a[href="#s3"]').click()
    assert page.locator("#toc").bounding_box()["y"] == 0  # sticky beside the sections, at the window's top
    page.set_viewport_size({"width": 900, "height": 900})
    try:
        page.evaluate("() => scrollTo(0, 0)")
        assert page.locator("#toc").bounding_box()["width"] > 800  # above the sections, as wide as the page
        page.locator('#toc a[href="#s2"]').click()
        assert 0 <= page.evaluate(LANDED, "#s2")["top"] <= 20
    finally:
        page.set_viewport_size({"width": 1280, "height": 900})


SUMMARY = """() => [...document.querySelectorAll('#summary li')].map(li => ({
  href: li.querySelector('a').getAttribute('href'),
  dir: document.querySelector(li.querySelector('a').getAttribute('href') + ' h3').textContent,
  numbers: [...li.querySelectorAll('.num')].map(s => [s.dataset.path, s.textContent]),
}))"""


def test_the_summary_gives_each_runs_headline_linked_to_its_section(shown, page_runs):
    items = shown.evaluate(SUMMARY)
    assert {Path(item["dir"]) for item in items} == set(page_runs.values())
    for item in items:
        results = runs.read_json(Path(item["dir"]) / runs.RESULTS)
        assert item["numbers"], item  # the run's first headline, with its numbers
        for path, text in item["numbers"]:
            value = results
            for key in json.loads(path):
                value = value[key]
            assert math.isclose(float(text.replace(",", "")), value, rel_tol=1e-3), (item["dir"], path, text, value)


def figure_file(alt: str, page_runs) -> Path:
    """The PNG a figure's alt text names ("lm/figures/lm_loss.png")."""
    directory, rest = alt.split("/", 1)
    return page_runs[directory] / rest


SHOWN_IMAGE = """() => {
  const box = document.getElementById('lightbox'), img = box.querySelector('img'), r = img.getBoundingClientRect();
  return {hidden: box.hidden, natural: [img.naturalWidth, img.naturalHeight], drawn: [r.width, r.height],
          alt: img.alt};
}"""


def test_clicking_a_figure_shows_it_at_its_natural_size(shown, page_runs):
    page = shown
    figures = page.locator("figure img")
    assert figures.count() == sum(len(list((d / runs.FIGURES).glob("*.png"))) for d in page_runs.values())
    for i in range(figures.count()):
        figure = figures.nth(i)
        alt = figure.get_attribute("alt")
        with Image.open(figure_file(alt, page_runs)) as png:
            size = list(png.size)
        inline = figure.bounding_box()
        assert inline["width"] < size[0] or size[0] <= 1100, (alt, inline)  # shown smaller in the page…
        figure.click()
        page.wait_for_function("() => !document.getElementById('lightbox').hidden")
        shown_image = page.evaluate(SHOWN_IMAGE)
        assert shown_image["alt"] == alt
        assert shown_image["natural"] == size and shown_image["drawn"] == pytest.approx(size, abs=0.5), shown_image
        page.keyboard.press("Escape")  # …and at full size, pixel for pixel, until closed
        assert page.evaluate(SHOWN_IMAGE)["hidden"]
    assert page.errors == [] and page.external == []


IMAGES = re.compile(r'<img alt="([^"]+)"[^>]*src="data:(image/[a-z]+);base64,([A-Za-z0-9+/=]+)"')


def test_each_figure_is_inlined_once_with_its_pixels_kept(written, page_runs):
    """Re-encoded smaller for the page in 256 colours: the oracle is the PNG on disk, read by Pillow; its size
    is kept, nearly all of its pixels exactly, the rest (antialiased edges) within a few levels."""
    found = IMAGES.findall(written.read_text())
    files = sorted(p for d in page_runs.values() for p in (d / runs.FIGURES).glob("*.png"))
    assert sorted(figure_file(alt, page_runs) for alt, _, _ in found) == files  # each once
    inlined = png = 0
    for alt, _, data in found:
        raw = base64.b64decode(data)
        inlined, png = inlined + len(raw), png + figure_file(alt, page_runs).stat().st_size
        with Image.open(io.BytesIO(raw)) as image, Image.open(figure_file(alt, page_runs)) as original:
            assert image.size == original.size, alt
            error = np.abs(np.asarray(image.convert("RGB"), int) - np.asarray(original.convert("RGB"), int))
            assert (error.max(axis=2) == 0).mean() > 0.9 and (error.max(axis=2) <= 16).mean() > 0.99, alt
            assert error.mean() < 0.5, alt
    assert inlined < 0.4 * png, (inlined, png)  # about 4× smaller than the PNGs here


def test_there_is_no_horizontal_scroll_on_a_1400_px_screen(shown):
    page = shown
    page.set_viewport_size({"width": 1400, "height": 900})
    try:
        unfold(page)
        width = page.evaluate("() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]")
        assert width[0] <= width[1], width
    finally:
        page.set_viewport_size({"width": 1280, "height": 900})


PER_RUN = """() => [...document.querySelectorAll('.chart')].filter(c => /^(u\\/w per |Adam's effective)/.test(
  c.querySelector('h4').textContent)).map(c => ({title: c.querySelector('h4').textContent,
  folded: !!c.closest('details:not([open])'), width: c.getBoundingClientRect().width}))"""


def test_a_runs_per_parameter_charts_are_folded_away_and_drawn_when_opened(page, written):
    load(page, written.as_uri())
    folded = page.evaluate(PER_RUN)
    assert folded and all(chart["folded"] for chart in folded), folded
    assert page.locator("article .headline").first.is_visible()  # the one-liners stay in view
    assert not page.locator("article details pre").first.is_visible()  # config.json is folded
    unfold(page)
    opened = page.evaluate(PER_RUN)
    assert all(not chart["folded"] and chart["width"] > 100 for chart in opened), opened
    assert page.errors == []


LOSS_LINES = """(section) => {
  const s = [...document.querySelectorAll('section')].find(s => s.querySelector('h2').textContent === section);
  const titles = [...s.querySelectorAll('.chart h4')].map(h => h.textContent);
  const chart = [...s.querySelectorAll('.chart')].find(c => c.querySelector('h4').textContent === 'Loss');
  const root = Bokeh.documents[0].get_model_by_id(chart.querySelector('[data-root-id]').dataset.rootId);
  const tabs = root.tabs.map(t => [t.title, Object.fromEntries(t.child.renderers.filter(r => r.name && r.glyph.marker
    === undefined).map(r => [r.name, [Array.from(r.data_source.data.x), Array.from(r.data_source.data.y)]]))]);
  return {titles, tabs: Object.fromEntries(tabs)};
}"""


def close(got, expected):
    pairs = zip(got, expected, strict=False)
    return len(got) == len(expected) and all(math.isclose(g, e, rel_tol=1e-4) for g, e in pairs)


def test_one_loss_chart_holds_every_loss_series_of_the_lm_section(shown, page_runs):
    """The lm section used to draw its losses in five charts (training loss against step and time, validation loss,
    the monitor's loss and its running mean); one chart with tabs now holds each series once. Oracle:
    results.json and metrics.jsonl."""
    drawn = shown.evaluate(LOSS_LINES, "lm")
    assert drawn["titles"].count("Loss") == 1
    gone = ("Training loss against step", "Validation loss", "Loss at each logged step")
    gone += ("mean_loss at each logged step",)
    assert not set(gone) & set(drawn["titles"]), drawn["titles"]
    tabs = ("against step", "against training time", "each logged step (metrics.jsonl)")
    step, time, logged = (drawn["tabs"][t] for t in tabs)
    results = runs.read_json(page_runs["lm"] / runs.RESULTS)
    records = [r for r in runs.read_jsonl(page_runs["lm"] / runs.METRICS) if not r.get("diverged")]
    for name, run in results["runs"].items():
        finite = [(s, v) for s, v in zip(run["train"]["step"], run["train"]["loss"], strict=True) if math.isfinite(v)]
        if finite:
            assert close(step[name][1], [v for _, v in finite]), name
            assert close(time[name][1], [v for _, v in finite]), name
        val = [v for v in run["eval"]["val_loss"] if math.isfinite(v)]
        if val:
            assert close(step[f"{name} val"][1], val) and close(time[f"{name} val"][1], val), name
        logged_losses = [r["loss"] for r in records if r.get("run") == name and math.isfinite(r["loss"])]
        if logged_losses:
            assert close(logged[name][1], logged_losses), name
        # the running mean a chart of its own drew: the training loss's line, point for point
        means = [r["mean_loss"] for r in records if r.get("run") == name and "mean_loss" in r]
        assert not means or close([v for v in means if math.isfinite(v)], [v for _, v in finite]), name


def test_the_page_of_small_runs_is_bokehjs_its_figures_and_little_else(written):
    """The page's size rule (the demo's 5 MB is benchmarks/report_size.py's claim): BokehJS's core bundle once (not
    its widgets), the figures once, and the charts and text of six experiments' tiny runs under 1.5 MB."""
    from bokeh.resources import Resources

    text = written.read_text()
    images = sum(len(data) for _, _, data in IMAGES.findall(text))
    bokeh = len(Resources(mode="inline", components=["bokeh"]).render_js())
    assert text.count("BEGIN bokeh.min.js") == 1 and "bokeh-widgets" not in text
    assert len(text) - images - bokeh < 1.5e6, (len(text), images, bokeh)
    assert len(text.encode()) < 5e6
