"""An edge-of-stability section read as a user reads it, in Chromium: the status counts the runs that diverged,
the description names the runs' own optimizers and thresholds, and every chart's legend names its lines and
fits in its chart. Oracle: results.json and metrics.jsonl on disk."""

from __future__ import annotations

import json
import shutil

import pytest

from optiscope import cli, runs

from .browser import load, unfold

LEGEND = """(title) => {
  const chart = [...document.querySelectorAll('.chart')].find(c => c.querySelector('h4').textContent === title);
  const id = chart.querySelector('[data-root-id]').dataset.rootId;
  const root = Bokeh.documents[0].get_model_by_id(id);
  const view = Bokeh.index[id];
  const legends = [...root.right, ...root.center].filter(m => m.click_policy !== undefined);
  const boxes = legends.map(l => view.views.find_one(l).bbox);
  return {labels: legends.flatMap(l => l.items.flatMap(i => i.get_labels_list_from_label_prop())),
          inside: boxes.every(b => b.top >= view.bbox.top && b.bottom <= view.bbox.bottom)};
}"""
TITLES = "() => [...document.querySelectorAll('.chart h4')].map(h => h.textContent)"


@pytest.fixture
def eos(tiny_runs, tmp_path):
    """A copy of the tiny edge-of-stability run, its checkpoints left out."""
    out = tmp_path / "eos"
    shutil.copytree(tiny_runs["edge-of-stability"], out, ignore=shutil.ignore_patterns("checkpoints"))
    return out


def edit_results(path, change):
    results = runs.read_json(path / runs.RESULTS)
    change(results)
    (path / runs.RESULTS).write_text(json.dumps(results))
    return results


def shown(page, run_dir):
    assert cli.main(["report", str(run_dir)]) == 0
    load(page, (run_dir / "report.html").as_uri())
    unfold(page)  # the per-parameter charts, folded under each run's name, drawn as a reader opens them
    assert page.errors == []
    return page


def test_the_status_says_how_many_runs_diverged_when_only_some_did(page, eos):
    def one_diverged(r):
        r["runs"][0].update(status="diverged", divergence={"step": 7, "reason": "loss is nan"})

    results = edit_results(eos, one_diverged)
    diverged = sum(r["status"] == "diverged" for r in results["runs"])
    assert results["status"] == "ok" and 0 < diverged < len(results["runs"])  # the case at hand
    status = shown(page, eos).locator("article > p").first.inner_text()
    assert status.startswith(f"Status: ok, {diverged} of {len(results['runs'])} runs diverged"), status


def test_the_section_names_the_thresholds_of_its_own_runs(page, eos):
    def nesterov(r):  # the momentum run as a Nesterov one would be recorded: its own threshold label
        run = next(x for x in r["runs"] if x["optimizer"] == "momentum")
        run.update(optimizer="nesterov", label="nesterov@0.35", threshold_label="1.36/η")

    results = edit_results(eos, nesterov)
    text = shown(page, eos).locator("section > p.muted").first.inner_text()
    for run in results["runs"]:
        measure = "λ₁(P⁻¹H)" if run["preconditioned"] else "λ₁(H)"
        assert f"{run['optimizer']} {measure} against {run['threshold_label']}" in text, text
    named = {run["threshold_label"] for run in results["runs"]}
    assert "3.8/η" not in named and "3.8/η" not in text, text  # no momentum run: no momentum threshold


def recorded(run_dir):
    """The monitor's records in ``run_dir``'s metrics.jsonl, and the parameters they name, in their order."""
    records = [json.loads(line) for line in (run_dir / runs.METRICS).read_text().splitlines() if line.strip()]
    params = list(dict.fromkeys(name for r in records if not r.get("diverged") for name in r.get("params", {})))
    return records, params


def test_every_line_chart_has_a_legend_that_names_its_lines_and_fits(page, eos):
    page = shown(page, eos)
    _, params = recorded(eos)
    per_parameter = [t for t in page.evaluate(TITLES) if t.startswith("u/w per parameter over training")]
    assert per_parameter
    for title in per_parameter:
        legend = page.evaluate(LEGEND, title)
        assert legend["labels"] == params and legend["inside"], (title, legend)


def test_a_long_legend_is_not_cut_off_by_its_chart(page, eos, tmp_path):
    """Three directories overlaid: the sharpness chart has a sharpness and a threshold line per run of each, more
    entries than a chart of the usual height holds; the chart grows to show them all."""
    dirs = [eos, *(tmp_path / f"copy{i}" for i in (1, 2))]
    for d in dirs[1:]:
        shutil.copytree(eos, d)
    assert cli.main(["report", *map(str, dirs), "--out", str(tmp_path / "page.html")]) == 0
    load(page, (tmp_path / "page.html").as_uri())
    sharpness = page.evaluate(LEGEND, "Sharpness against its stability threshold")
    assert len(sharpness["labels"]) == 2 * len(dirs) * len(runs.read_json(eos / runs.RESULTS)["runs"])
    assert sharpness["inside"], sharpness


def test_an_lm_runs_per_layer_chart_names_its_layers(page, tiny_runs, tmp_path):
    lm = tmp_path / "lm"
    shutil.copytree(tiny_runs["lm"], lm, ignore=shutil.ignore_patterns("checkpoints"))
    results = runs.read_json(lm / runs.RESULTS)
    page = shown(page, lm)
    for name, run in results["runs"].items():
        legend = page.evaluate(LEGEND, f"u/w per layer, {name}")
        assert sorted(legend["labels"]) == sorted(run["update_ratio"]["layers"]) and legend["inside"], (name, legend)


COLOURS = """(title) => {
  const chart = [...document.querySelectorAll('.chart')].find(c => c.querySelector('h4').textContent === title);
  const root = Bokeh.documents[0].get_model_by_id(chart.querySelector('[data-root-id]').dataset.rootId);
  const data = root.renderers.map(r => r.data_source.data).find(d => d.label);
  return Object.fromEntries([...data.label].map((label, i) => [label, data.color[i]]));
}"""


def test_a_layer_has_one_colour_in_every_runs_per_layer_chart(page, tiny_runs, tmp_path):
    """muon+adamw lists its layers in another order than sgd (its matrices first): each layer must still be drawn
    in one colour on every run's chart (oracle: the colours the browser draws, the layers in results.json)."""
    lm = tmp_path / "lm"
    shutil.copytree(tiny_runs["lm"], lm, ignore=shutil.ignore_patterns("checkpoints"))
    results = runs.read_json(lm / runs.RESULTS)
    orders = {tuple(r["update_ratio"]["layers"]) for r in results["runs"].values()}
    assert len(orders) > 1  # the case at hand: the runs list their layers in different orders
    page = shown(page, lm)
    titles = [t for t in page.evaluate(TITLES) if t.startswith("u/w per layer, ")]
    colours = [page.evaluate(COLOURS, t) for t in titles]
    assert len(colours) >= 2
    for layer in {layer for c in colours for layer in c}:
        assert len({c[layer] for c in colours if layer in c}) == 1, (layer, colours)


def test_the_effective_learning_rate_chart_names_its_parameters(page, eos):
    page = shown(page, eos)
    records = [json.loads(line) for line in (eos / runs.METRICS).read_text().splitlines() if line.strip()]
    titles = [t for t in page.evaluate(TITLES) if t.startswith("Adam's effective learning rate, ")]
    assert titles
    for title in titles:
        run = title.removeprefix("Adam's effective learning rate, ")
        with_eff = [r for r in records if r.get("run") == run and not r.get("diverged")]
        params = list(dict.fromkeys(n for r in with_eff for n, v in r.get("params", {}).items() if "eff_lr" in v))
        legend = page.evaluate(LEGEND, title)
        assert legend["labels"] == params and legend["inside"], (title, legend)


ROWS = """(title) => {
  const chart = [...document.querySelectorAll('.chart')].find(c => c.querySelector('h4').textContent === title);
  const root = Bokeh.documents[0].get_model_by_id(chart.querySelector('[data-root-id]').dataset.rootId);
  const labels = root.left[0].major_label_overrides;
  const at = [...(labels instanceof Map ? labels.entries() : Object.entries(labels))];
  const cells = root.renderers[0].data_source.data, top = Math.max(...cells.y);
  return {labels: at.sort((a, b) => Number(b[0]) - Number(a[0])).map(([, label]) => label),
          top: [...cells.v].filter((v, i) => cells.y[i] === top)};
}"""


def test_the_heatmap_lists_parameters_from_the_top_in_model_order(page, eos):
    """Read top to bottom, as the legend of the per-parameter lines and metrics.jsonl list them."""
    page = shown(page, eos)
    records, params = recorded(eos)
    titles = [t for t in page.evaluate(TITLES) if t.startswith("u/w per parameter, ")]
    assert titles
    for title in titles:
        run = title.removeprefix("u/w per parameter, ")
        rows = page.evaluate(ROWS, title)
        first = [r["params"][params[0]]["u_over_w"] for r in records if r.get("run") == run and not r.get("diverged")]
        assert rows["labels"] == params, title
        assert rows["top"] == pytest.approx([v for v in first if v > 0], rel=1e-6), title  # its cells are the top row
