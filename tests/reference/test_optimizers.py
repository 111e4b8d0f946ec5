"""The NumPy twins against closed forms, so that the oracle has an oracle of its own."""

import numpy as np
import pytest

from optiscope import reference


def _quadratic_run(opt_cls, steps, d=0.5, theta0=2.0, target=-1.0, **kwargs):
    params = [{"params": np.array([theta0]), "grad": np.zeros(1)}]
    opt = opt_cls(params, **kwargs)
    for _ in range(steps):
        params[0]["grad"][...] = d * (params[0]["params"] - target)
        opt.step()
    return params[0]["params"][0], opt


def test_sgd_contracts_geometrically():
    theta, _ = _quadratic_run(reference.SGD, 25, lr=0.1)
    assert theta == pytest.approx(-1.0 + (1 - 0.1 * 0.5) ** 25 * 3.0, rel=1e-12)


def test_heavy_ball_follows_its_recurrence():
    # e_{t+1} = (1 + μ − ηd) e_t − μ e_{t−1} for the error e = θ − θ*, with e_1 = (1 − ηd) e_0.
    lr, mu, d = 0.1, 0.9, 0.5
    e = [3.0, (1 - lr * d) * 3.0]
    for _ in range(29):
        e.append((1 + mu - lr * d) * e[-1] - mu * e[-2])
    theta, _ = _quadratic_run(reference.SGD, 30, lr=lr, momentum=mu, d=d)
    assert theta == pytest.approx(-1.0 + e[30], rel=1e-10)


def test_adam_first_step_is_lr_and_state_is_in_place():
    theta, opt = _quadratic_run(reference.Adam, 1, lr=0.01)
    assert theta == pytest.approx(2.0 - 0.01, rel=1e-9)
    m = opt.state[0]["m"]
    opt.params[0]["grad"][...] = -1.0
    opt.step()
    assert opt.state[0]["m"] is m and opt.t == 2


def test_adamw_shrinks_by_one_minus_lr_lambda_at_zero_gradient():
    params = [{"params": np.array([1.0, -2.0]), "grad": np.zeros(2)}]
    opt = reference.AdamW(params, lr=0.1, weight_decay=0.5)
    opt.step()
    np.testing.assert_allclose(params[0]["params"], [0.95, -1.9], rtol=1e-15)


def test_rejects_mismatched_grad():
    with pytest.raises(ValueError, match=r"params\[0\] must be a dict with 'params' and 'grad'"):
        reference.SGD([{"params": np.zeros(2), "grad": np.zeros(3)}])
