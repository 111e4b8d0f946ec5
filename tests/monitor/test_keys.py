"""The flat key scheme for loggers: each key's value against the quantity computed apart, from the weights."""

import math

import pytest
import torch
from test_monitor import tiny_lm, train_step

from optiscope.monitor import Curvature, Monitor, flat_metrics
from optiscope.monitor.keys import CURVATURE, PER_PARAMETER


def _step(optimizer_cls=torch.optim.Adam, curvature=None, **step_scalars):
    """One measured step of a tiny model, with the weights before and after it read apart from the monitor."""
    model, data = tiny_lm()
    opt = optimizer_cls(model.parameters(), lr=1e-2)
    monitor = Monitor(model, opt, curvature=curvature)
    before = [p.detach().clone() for p in model.parameters()]
    loss = train_step(model, opt, data)
    grads = [p.grad.clone() for p in model.parameters()]
    opt.step()
    record = monitor.step(loss, **step_scalars)
    monitor.close()
    after = [p.detach() for p in model.parameters()]
    return record, model, before, after, grads, float(loss.detach())


def _norm(tensors):
    return float(torch.sqrt(sum(t.double().pow(2).sum() for t in tensors)))


def test_the_totals_are_the_whole_models_norms():
    record, _, before, after, grads, loss = _step()
    flat = flat_metrics(record)
    u = _norm([a - b for a, b in zip(after, before, strict=True)])
    w = _norm(after)
    assert flat["optiscope/loss"] == pytest.approx(loss, rel=1e-6)
    assert flat["optiscope/grad_norm_after_clip/total"] == pytest.approx(_norm(grads), rel=1e-5)
    assert flat["optiscope/weight_norm/total"] == pytest.approx(w, rel=1e-5)
    assert flat["optiscope/update_norm/total"] == pytest.approx(u, rel=1e-4)
    assert flat["optiscope/u_over_w/total"] == pytest.approx(u / w, rel=1e-4)
    assert flat["optiscope/lr/group0"] == 0.01
    # totals only by default: no key names a parameter, and none is a bare name a host logs (grad_norm)
    assert all(key.startswith("optiscope/") for key in flat)
    assert not any(key.endswith(("/0.weight", "/4.bias")) for key in flat)
    assert "optiscope/grad_norm" not in flat and all(isinstance(v, float) for v in flat.values())


def test_per_parameter_series_on_request_by_name_or_pattern():
    record, model, before, after, grads, _ = _step()
    names = [name for name, _ in model.named_parameters()]
    everything = flat_metrics(record, per_parameter=True)
    for i, name in enumerate(names):
        u = _norm([after[i] - before[i]])
        assert everything[f"optiscope/update_norm/{name}"] == pytest.approx(u, rel=1e-4)
        assert everything[f"optiscope/weight_norm/{name}"] == pytest.approx(_norm([after[i]]), rel=1e-5)
        assert everything[f"optiscope/grad_norm_after_clip/{name}"] == pytest.approx(_norm([grads[i]]), rel=1e-5)
        cos = float(torch.nn.functional.cosine_similarity((after[i] - before[i]).flatten(), -grads[i].flatten(), 0))
        assert everything[f"optiscope/cos_u_neg_g/{name}"] == pytest.approx(cos, abs=1e-4)
        assert f"optiscope/eff_lr_median/{name}" in everything
    assert len(everything) == len(flat_metrics(record)) + len(names) * (len(PER_PARAMETER) + 1)

    def series(flat):
        return {k.split("/", 2)[2] for k in flat if k.startswith("optiscope/update_norm/")} - {"total"}

    assert series(flat_metrics(record, per_parameter="*.bias")) == {n for n in names if n.endswith(".bias")}
    assert series(flat_metrics(record, per_parameter=["0.*", "4.weight"])) == {"0.weight", "4.weight"}


def test_curvature_and_given_scalars_under_their_own_keys():
    x, y = torch.randint(0, 12, (8, 3)), torch.randint(0, 12, (8,))

    def loss_fn(m, batch):
        return torch.nn.functional.cross_entropy(m(batch[0]), batch[1])

    curvature = Curvature((x, y), loss_fn, every=1, trace_probes=2, micro_batches=2)
    record, *_ = _step(torch.optim.SGD, curvature, val_acc=0.75)
    flat = flat_metrics(record)
    for field, key in CURVATURE.items():
        if record.get(field) is not None:
            assert flat[f"optiscope/{key}"] == record[field]
    assert flat["optiscope/stability_threshold"] == pytest.approx(2 / 0.01)  # 2/η for plain SGD
    assert flat["optiscope/sharpness_over_threshold"] == pytest.approx(flat["optiscope/sharpness"] / 200, rel=1e-6)
    assert flat["optiscope/val_acc"] == 0.75
    assert "optiscope/sharpness/threshold" not in flat  # one level per key: no name nests under another's


def test_none_is_left_out_and_nan_is_kept_and_a_divergence_is_one_key():
    record, *_ = _step()
    record = {**record, "loss": None, "lr": [None], "total": {**record["total"], "u_over_w": math.nan}}
    flat = flat_metrics(record)
    assert "optiscope/loss" not in flat and "optiscope/lr/group0" not in flat
    assert math.isnan(flat["optiscope/u_over_w/total"])
    diverged = {"diverged": True, "step": 7, "loss": math.inf, "reason": "non-finite loss"}
    assert flat_metrics(diverged, prefix="probe") == {"probe/loss": math.inf, "probe/diverged": 1.0}


@pytest.mark.parametrize(
    ("option", "said"),
    [
        ({"prefix": "a b"}, "flat_metrics: prefix='a b' must be a name of letters, digits"),
        ({"prefix": ""}, "flat_metrics: prefix='' must be a name"),
        ({"per_parameter": 3}, "flat_metrics: per_parameter=3 must be True, False, a glob pattern"),
        ({"per_parameter": []}, r"flat_metrics: per_parameter=\[\] must be True, False"),
        ({"per_parameter": ["ok", 1]}, r"flat_metrics: per_parameter=\['ok', 1\] must be"),
    ],
)
def test_bad_options_are_refused_in_one_line(option, said):
    record, *_ = _step()
    with pytest.raises(ValueError, match=f"^{said}[^\n]*$"):
        flat_metrics(record, **option)
