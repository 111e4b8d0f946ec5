"""The report of tiny runs of every experiment, opened in a real browser: no errors, no request leaves
the file, every chart drawn with data, headline numbers equal to results.json, runs toggle."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from optiscope import cli, report

from .browser import load, open_page, unfold
from .monitored import monitored_dir

CHARTS = """() => {
  const doc = Bokeh.documents[0];
  const canvases = (root) => [...root.querySelectorAll('*')].reduce(
    (n, e) => n + (e.tagName === 'CANVAS') + (e.shadowRoot ? canvases(e.shadowRoot) : 0), 0);
  return [...document.querySelectorAll('.chart')].map(c => {
    const el = c.querySelector('[data-root-id]');
    const root = doc.get_model_by_id(el.dataset.rootId);
    const plots = root.tabs ? root.tabs.map(t => t.child) : [root];
    const points = plots.map(p => p.renderers.reduce((n, r) => n + r.data_source.get_length(), 0));
    const view = Bokeh.index[el.dataset.rootId];
    const box = view.el.getBoundingClientRect();
    return {title: c.querySelector('h4').textContent, points, width: box.width, height: box.height,
            canvases: view.el.shadowRoot ? canvases(view.el.shadowRoot) : 0};
  });
}"""

HEADLINES = """() => [...document.querySelectorAll('article')].map(a => ({
  dir: a.querySelector('h3').textContent,
  numbers: [...a.querySelectorAll('.headline .num')].map(s => [s.dataset.path, s.dataset.value, s.textContent]),
}))"""

#: The name of a section's loss chart's view against step (the first tab of its "Loss" chart).
LOSS_VIEW = """(section) => {
  const s = [...document.querySelectorAll('section')].find(s => s.querySelector('h2').textContent === section);
  const chart = [...s.querySelectorAll('.chart')].find(c => c.querySelector('h4').textContent === 'Loss');
  return Bokeh.documents[0].get_model_by_id(chart.querySelector('[data-root-id]').dataset.rootId).tabs[0].child.name;
}"""

VISIBLE = """([name, label]) => Bokeh.documents[0].get_model_by_name(name).renderers
  .filter(r => r.name === label).map(r => r.visible)"""


def walk(document, path):
    for key in path:
        document = document[key]
    return document


def test_every_experiment_loads_offline_with_every_chart_drawn(shown, written, page_runs, tmp_path):
    page = shown
    assert page.errors == []
    assert page.external == [] and page.failed == []
    assert all(url == written.as_uri() or url.startswith("data:") for url in page.requests), page.requests
    unfold(page)  # the per-parameter charts of each run are collapsed
    charts = page.evaluate(CHARTS)
    assert len(charts) >= 20
    for chart in charts:
        assert chart["points"][0] > 0 and chart["width"] > 100 and chart["height"] > 100, chart
        assert chart["canvases"] > 0, chart
    sections = page.locator("section h2").all_text_contents()
    assert set(sections) == set(page_runs), sections
    shot = tmp_path / "report.png"
    page.screenshot(path=str(shot))
    print(f"screenshot of the report: {shot}")


def test_headline_numbers_are_those_of_results_json(shown, page_runs):
    page = shown
    articles = page.evaluate(HEADLINES)
    assert {Path(a["dir"]) for a in articles} == set(page_runs.values())
    for article in articles:
        results = json.loads((Path(article["dir"]) / "results.json").read_text())
        assert len(article["numbers"]) >= 3, article["dir"]
        for path, value, text in article["numbers"]:
            expected = walk(results, json.loads(path))
            assert float(value) == expected, (path, value, expected)
            shown = float(text.replace(",", ""))  # 10,010: thousands separated
            if isinstance(expected, int):
                assert shown == expected
            else:
                assert math.isclose(shown, expected, rel_tol=1e-3), (path, text, expected)


def test_a_legend_click_hides_that_run(shown):
    page = shown
    name = page.evaluate(LOSS_VIEW, "lm")  # the lm section's loss chart
    assert page.evaluate(VISIBLE, [name, "adamw"]) == [True]
    chart = page.locator(".chart").filter(has_text="Loss").first
    chart.get_by_text("adamw", exact=True).first.click()
    page.wait_for_function(f"() => !({VISIBLE})(['{name}', 'adamw'])[0]")
    assert page.evaluate(VISIBLE, [name, "sgd"]) == [True]
    chart.get_by_text("adamw", exact=True).first.click()
    page.wait_for_function(f"() => ({VISIBLE})(['{name}', 'adamw'])[0]")


SPAN = """([name, label]) => {
  const chart = Bokeh.documents[0].get_model_by_name(name);
  const ys = (keep) => chart.renderers.filter(keep).flatMap(r => [...r.data_source.data.y]);
  const others = ys(r => r.visible && r.name !== label), hidden = ys(r => r.name === label);
  return {start: chart.y_range.start, end: chart.y_range.end, low: Math.min(...others), high: Math.max(...others),
          hiddenLow: Math.min(...hidden), hiddenHigh: Math.max(...hidden)};
}"""


def test_hiding_a_run_rescales_the_chart_to_the_runs_still_shown(shown):
    """A diverged run's huge loss flattens the others to a line; hidden by its legend entry, it must leave the
    scale to the runs still shown (oracle: their own data's extremes)."""
    page = shown
    name = page.evaluate(LOSS_VIEW, "lm")
    chart = page.locator(".chart").filter(has_text="Loss").first
    names = "(name) => [...new Set(Bokeh.documents[0].get_model_by_name(name).renderers.map(r => r.name))]"
    lines = page.evaluate(names, name)
    spans = {run: page.evaluate(SPAN, [name, run]) for run in lines}
    label = next(run for run, span in spans.items() if span["hiddenLow"] < span["low"])  # hiding it can narrow
    before = page.evaluate(SPAN, [name, label])
    chart.get_by_text(label, exact=True).first.click()
    page.wait_for_function(f"() => ({SPAN})(['{name}', '{label}']).start > {before['start']}", timeout=10_000)
    after = page.evaluate(SPAN, [name, label])
    assert before["hiddenLow"] < after["start"] <= after["low"] and after["end"] >= after["high"]
    chart.get_by_text(label, exact=True).first.click()


def test_one_directory_gets_its_own_page_and_several_their_common_parent(tiny_runs):
    assert report.default_out([tiny_runs["lm"]]) == tiny_runs["lm"] / "report.html"
    assert report.default_out(list(tiny_runs.values())) == tiny_runs["lm"].resolve().parent / "report.html"


def test_a_monitors_directory_gets_the_monitors_charts(browser, tmp_path):
    """A directory a Monitor wrote (its JSONL sink, as the 🤗 and Lightning callbacks do: metrics.jsonl and no
    results.json) is monitored training, drawn from metrics.jsonl, sharpness against its threshold included."""
    import torch

    from optiscope.monitor import Curvature, JSONLSink, Monitor

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    x, y = torch.randn(32, 3), torch.randn(32, 1)

    def loss_fn(m, batch):
        return ((m(batch[0]) - batch[1]) ** 2).mean()

    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    run_dir = tmp_path / "monitored"
    curvature = Curvature((x, y), loss_fn, every=2)
    monitor = Monitor(model, opt, every=2, sinks=[JSONLSink(run_dir / "metrics.jsonl")], curvature=curvature)
    for _ in range(6):
        opt.zero_grad()
        loss = loss_fn(model, (x, y))
        loss.backward()
        opt.step()
        monitor.step(loss)
    monitor.close()
    assert cli.main(["report", str(run_dir)]) == 0
    context, page = open_page(browser)
    load(page, (run_dir / "report.html").as_uri())
    assert page.errors == []
    assert page.locator("section h2").all_text_contents() == ["Monitored training"]
    assert "results.json is missing" not in page.content()
    charts = {c["title"]: c["points"][0] for c in page.evaluate(CHARTS)}
    assert charts["Loss at each logged step"] > 0 and charts["Sharpness against its stability threshold"] > 0
    context.close()


LINES = """(title) => {
  const doc = Bokeh.documents[0];
  const chart = [...document.querySelectorAll('.chart')].find(c => c.querySelector('h4').textContent === title);
  const root = doc.get_model_by_id(chart.querySelector('[data-root-id]').dataset.rootId);
  return root.renderers.filter(r => r.data_source.data.y).map(r => [r.name, Array.from(r.data_source.data.y)]);
}"""


def test_the_gradient_norm_chart_draws_the_norm_before_clipping_beside_the_clipped_one(browser, tmp_path):
    """A run of the training loop that clips records both norms; the chart draws each as recorded."""
    records = [
        {"run": "a", "step": s, "loss": 1.0, "grad_norm": 1.0, "grad_norm_before_clip": 3.0**s} for s in (1, 2, 3)
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert cli.main(["report", str(tmp_path)]) == 0
    context, page = open_page(browser)
    load(page, (tmp_path / "report.html").as_uri())
    lines = {name: y for name, y in page.evaluate(LINES, "Gradient norm") if name}
    assert lines["a"] == [1.0, 1.0, 1.0] and lines["a before clipping"] == [3.0, 9.0, 27.0]
    assert page.errors == []
    context.close()


Y_SPAN = """(title) => {
  const chart = [...document.querySelectorAll('.chart')].find(c => c.querySelector('h4').textContent === title);
  const root = Bokeh.documents[0].get_model_by_id(chart.querySelector('[data-root-id]').dataset.rootId);
  return {start: root.y_range.start, end: root.y_range.end, title: root.title.text,
          drawn: root.renderers.filter(r => r.visible).map(r => r.name)};
}"""


NAMED_SPAN = """(name) => {
  const root = Bokeh.documents[0].get_model_by_name(name);
  return {start: root.y_range.start, end: root.y_range.end,
          drawn: root.renderers.filter(r => r.visible).map(r => r.name)};
}"""


def test_a_diverged_runs_exploding_loss_does_not_flatten_the_other_runs(browser, tmp_path):
    """GD on least squares at η = 5, far above 2/λ₁ (λ₁ of the mean squared error on standard normal inputs is
    about 2), diverges for certain: its loss grows by orders of magnitude before the monitor stops it. The
    linear loss chart's y axis fits the run that converged (oracle: its own recorded losses), and the diverged
    run is still drawn."""
    contexts = [{"run": "stable", "eta": 0.05}, {"run": "exploding", "eta": 5.0}]
    stable, exploding = monitored_dir(tmp_path, contexts, steps=40).values()
    assert max(exploding) > 1e3 * max(stable)  # the case at hand: it would flatten the stable run to the axis
    assert cli.main(["report", str(tmp_path)]) == 0
    context, page = open_page(browser)
    load(page, (tmp_path / "report.html").as_uri())
    span = page.evaluate(Y_SPAN, "Loss at each logged step")
    assert span["start"] <= min(stable) and max(stable) <= span["end"] < 2 * max(stable), (span, stable)
    assert {"stable eta=0.05", "exploding eta=5.0"} <= set(span["drawn"])
    assert "runs that did not diverge" in span["title"]
    # the stable run hidden by its legend entry: the axis fits the diverged run's finite losses, not nothing
    chart = page.locator(".chart").filter(has_text="Loss at each logged step").first
    chart.get_by_text("stable eta=0.05", exact=True).first.click()
    shown = [v for v in exploding if math.isfinite(v)]
    page.wait_for_function(f"() => ({Y_SPAN})('Loss at each logged step').end >= {max(shown)}", timeout=10_000)
    span = page.evaluate(Y_SPAN, "Loss at each logged step")
    assert span["start"] <= min(shown) and max(shown) <= span["end"], (span, shown)
    assert page.errors == []
    context.close()


def test_an_lm_run_that_diverged_leaves_the_loss_axes_to_the_others(browser, tiny_runs, tmp_path):
    """results.json's status is what the lm charts go by: the tiny run's sgd@1e30 diverged (NaN at once); given a
    last logged loss of 1e12, as a run that explodes more slowly logs, it leaves the y axes of the training-loss
    charts to the runs that did not diverge (oracle: their losses on disk)."""
    import shutil

    from optiscope import runs

    run_dir = Path(shutil.copytree(tiny_runs["lm"], tmp_path / "lm"))
    results = runs.read_json(run_dir / runs.RESULTS)
    (exploding,) = [name for name, r in results["runs"].items() if r["status"] == "diverged"]
    train = results["runs"][exploding]["train"]
    train["step"], train["loss"], train["seconds"] = [*train["step"], 2], [*train["loss"], 1e12], [0.1, 0.2]
    (run_dir / runs.RESULTS).write_text(json.dumps(results))
    assert cli.main(["report", str(run_dir)]) == 0
    context, page = open_page(browser)
    load(page, (run_dir / "report.html").as_uri())
    kept = [loss for r in results["runs"].values() if r["status"] == "ok" for loss in r["train"]["loss"]]
    chart = page.locator(".chart").filter(has_text="Loss").first
    for tab, name in (("against step", "e0-train"), ("against training time", "e0-time")):
        chart.get_by_text(tab, exact=True).click()  # a chart in a tab not shown has no ranges yet
        page.wait_for_function(f"() => Number.isFinite(Bokeh.documents[0].get_model_by_name('{name}').y_range.end)")
        span = page.evaluate(NAMED_SPAN, name)
        assert span["start"] <= min(kept) and max(kept) <= span["end"] < 2 * max(kept), (tab, span)
        assert exploding in span["drawn"]
    assert page.errors == []
    context.close()


HEAT = """(name) => {
  const chart = Bokeh.documents[0].roots().find(r => r.name === name);
  const hover = chart.toolbar.tools.find(t => t.formatters !== undefined && t.tooltips.length === 3);
  const formatters = hover.formatters instanceof Map ? hover.formatters : new Map(Object.entries(hover.formatters));
  const named = formatters.get("@y");
  const data = chart.renderers[0].data_source.data;
  return [...data.y].map((y, i) => [named.format(y, "name", {}), data.v[i]]);
}"""


def test_hovering_a_heatmap_cell_names_its_parameter(browser, tmp_path):
    """The u/w heatmap's hover says which parameter a cell is (the y axis's small labels overlap on a large
    model). The oracle: each cell's value is that parameter's u/w at some step of metrics.jsonl, and no other's."""
    from .monitored import diverging_run

    diverging_run(tmp_path / "metrics.jsonl", nan_step=8, curvature_every=4)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    measured = {}
    for r in records:
        for name, entry in r.get("params", {}).items():
            if math.isfinite(entry.get("u_over_w", math.nan)):
                measured.setdefault(name, []).append(entry["u_over_w"])
    assert len(measured) == 4  # the case at hand: an MLP's two weights and two biases
    assert cli.main(["report", str(tmp_path)]) == 0
    context, page = open_page(browser)
    load(page, (tmp_path / "report.html").as_uri())
    name = page.evaluate("() => Bokeh.documents[0].roots().map(r => r.name).find(n => n && n.includes('-heat-'))")
    cells = page.evaluate(HEAT, name)
    assert cells and {said for said, _ in cells} == set(measured)
    for said, value in cells:
        owners = {p for p, values in measured.items() if any(math.isclose(value, v, rel_tol=1e-6) for v in values)}
        assert owners == {said}, (said, value, owners)
    assert page.errors == []
    context.close()


def own_loop(run_dir, given, context=None, steps=6, every=2):
    """A Monitor in a plain loop writing ``run_dir/metrics.jsonl``, given ``given(step)`` as extra scalars at each
    step: {step: the scalars given} of the measured steps (the first and every ``every``-th)."""
    import torch

    from optiscope.monitor import JSONLSink, Monitor

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    monitor = Monitor(model, opt, every=every, sinks=[JSONLSink(run_dir / "metrics.jsonl")], context=context)
    x, y = torch.randn(16, 3), torch.randn(16, 1)
    measured = {}
    for step in range(1, steps + 1):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        monitor.step(loss, **given(step))
        if step == 1 or step % every == 0:
            measured[step] = given(step)
    monitor.close()
    return measured


XS = """(title) => {
  const chart = [...document.querySelectorAll('.chart')].find(c => c.querySelector('h4').textContent === title);
  const root = Bokeh.documents[0].get_model_by_id(chart.querySelector('[data-root-id]').dataset.rootId);
  return root.renderers.filter(r => r.name).map(r => [r.name, Array.from(r.data_source.data.x)]);
}"""


def test_your_own_loops_scalars_get_a_chart_each_and_its_run_is_named_by_its_directory(browser, tmp_path):
    """``monitor.step(loss, train_acc=…, val_loss=…)`` in a loop of one's own, no ``run`` label: each given
    scalar is a chart of its own against step, its line the values given at the measured steps (the oracle: what
    the loop passed), and the run is called by its directory, "my-run", in legends, headings and the status."""
    run_dir = tmp_path / "my-run"
    measured = own_loop(run_dir, lambda s: {"train_acc": s / 10, "val_loss": 100.0 - s})
    assert list(measured) == [1, 2, 4, 6]  # the case at hand: scalars given at every step, recorded when measured
    assert cli.main(["report", str(run_dir)]) == 0
    context, page = open_page(browser)
    load(page, (run_dir / "report.html").as_uri())
    assert page.errors == []
    titles = [c["title"] for c in page.evaluate(CHARTS)]
    assert {"train_acc at each logged step", "val_loss at each logged step"} <= set(titles), titles
    for field in ("train_acc", "val_loss"):
        ys = [[name, y] for name, y in page.evaluate(LINES, f"{field} at each logged step") if name]
        # the page holds values as float32: 7 significant digits, more than the 5 a chart keeps
        assert ys == [["my-run", pytest.approx([m[field] for m in measured.values()], rel=1e-6)]], (field, ys)
        assert page.evaluate(XS, f"{field} at each logged step") == [["my-run", [float(s) for s in measured]]]
    assert [name for name, _ in page.evaluate(LINES, "Loss at each logged step") if name] == ["my-run"]
    assert "u/w per parameter, my-run" in titles and not any(t.endswith(", run") for t in titles), titles
    assert "last logged: my-run at step 6" in page.locator("article p").first.text_content()
    context.close()


def test_the_runs_of_several_own_loops_are_named_by_their_directories_and_share_each_scalars_chart(tmp_path):
    """Two directories of Monitors without a ``run`` label: each run is its directory's name (not "run", nor
    "first: first"), a labelled run of a directory ``dir: run``, and both give lines to one chart per scalar;
    a scalar only one run gave has its chart all the same."""
    from optiscope.report import read_run
    from optiscope.report.charts import Sources
    from optiscope.report.page import divergence_lines
    from optiscope.report.sections import metrics_charts

    from .monitored import diverging_run

    diverging_run(tmp_path / "exploding" / "metrics.jsonl", nan_step=4, curvature_every=2)
    (line,) = divergence_lines(read_run(tmp_path / "exploding"))
    assert "exploding diverged at step 4" in line, line
    own_loop(tmp_path / "first", lambda s: {"train_acc": 0.5})
    own_loop(tmp_path / "second", lambda s: {"train_acc": 0.6, "grad_scale": 2.0**s})
    own_loop(tmp_path / "second", lambda s: {"train_acc": 0.7}, context={"run": "named"})
    group = [read_run(tmp_path / d) for d in ("first", "second")]
    found = dict(metrics_charts(Sources(), group, "k"))
    assert [r.name for r in found["Loss at each logged step"].renderers] == ["first", "second", "second: named"]
    assert {"u/w per parameter, first", "u/w per parameter, second", "u/w per parameter, second: named"} <= set(found)
    assert not any(title.endswith(("run", "first: first")) for title in found)
    assert [r.name for r in found["train_acc at each logged step"].renderers] == ["first", "second", "second: named"]
    assert [r.name for r in found["grad_scale at each logged step"].renderers] == ["second"]


def test_runs_that_diverged_in_a_finished_study_read_as_a_finding_and_a_crash_as_a_failure():
    """landscapes diverges at its largest η on purpose: that had shown in red bold beside "ok", as a failure. A
    crashed trial, no outcome of an optimizer, is still shown as one; so is a monitored loop's divergence."""
    from optiscope.report import page

    grid = [{"diverged_at": None}, {"diverged_at": 12}, {"diverged_at": None}]
    landscapes = report.RunDir(
        Path("runs/landscapes"),
        experiment="landscapes",
        results={"status": "ok", "surfaces": {"ravine": {"runs": {"sgd": {"grid": grid}}}}},
    )
    said = page.status_text(landscapes)
    assert '<span class="finding">1 of 3 runs of the η grids (one per optimizer, surface and η) diverged</span>' in said
    assert "status-bad" not in said
    trials = [{"status": "ok"}, {"status": "crashed"}]
    swept = report.RunDir(Path("runs/sweep"), experiment="sweep", results={"status": "ok", "trials": trials})
    assert '<span class="status-bad">1 of 2 trials crashed</span>' in page.status_text(swept)
    lm = report.RunDir(
        Path("runs/lm"),
        experiment="lm",
        results={
            "status": "ok",
            "divergence": {"adam@0.05": {"step": 40, "reason": "loss is nan", "run": "adam@0.05"}},
        },
    )
    assert page.divergence_lines(lm) == ['<p class="finding">adam@0.05 diverged at step 40: loss is nan.</p>']
    monitored = report.RunDir(Path("runs/mine"), metrics=[{"step": 3, "diverged": True, "reason": "loss is inf"}])
    assert page.divergence_lines(monitored)[0].startswith('<p class="status-bad">mine diverged at step 3')


@pytest.mark.parametrize(("items", "said"), [(4, "1 more finding"), (5, "2 more findings")])
def test_what_is_folded_is_counted_in_words_that_agree(items, said):
    """It had said "1 more findings"."""
    from optiscope.report import page

    folded = page.folded([f"<li>{i}</li>" for i in range(items)], "finding")
    assert folded[-1].startswith(f"<details><summary>{said}</summary>")
    assert page.folded(["a"] * 4, "divergence diagnosis", "divergence diagnoses")[-1].startswith(
        "<details><summary>1 more divergence diagnosis</summary>"
    )


FIGURES = """() => [...document.querySelectorAll('figure img')].map(i => ({
  alt: i.alt, shown: i.getBoundingClientRect().width, pixels: i.naturalWidth}))"""


def test_every_figure_of_the_demos_report_is_legible_at_a_1400_px_window(browser, demo):
    """Each figure is shown as wide as the page's column allows: its smallest text (the figure's own record, in its
    PNG: ``figures.style.SMALLEST_FONT_KEY``) renders at that size times the displayed width over the PNG's, at least
    ``LEGIBLE_PX`` (the multi-panel figures had shown their legends and labels at about 5 px)."""
    from PIL import Image

    from optiscope.figures import style

    context, page = open_page(browser)
    try:
        page.set_viewport_size({"width": 1400, "height": 900})
        load(page, (demo.out / "report.html").as_uri())
        shown = page.evaluate(FIGURES)
    finally:
        context.close()
    assert len(shown) >= 20  # every experiment's figures
    small = []
    for image in shown:
        with Image.open(demo.out / image["alt"]) as png:  # the alt text names the run's own PNG
            assert png.width == image["pixels"], image
            smallest = float(png.text[style.SMALLEST_FONT_KEY])
        rendered = smallest * image["shown"] / image["pixels"]
        if rendered < style.LEGIBLE_PX:
            small.append(f"{image['alt']} at {rendered:.1f} px")
    assert not small, small
