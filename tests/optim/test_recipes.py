"""``--optimizers`` parsing: one run per recipe and learning rate, however it is written."""

import pytest

from optiscope.errors import ConfigError
from optiscope.optim.recipes import parse_runs

DEFAULTS = {"sgd": 0.2, "adam": 0.01}


def test_names_with_and_without_a_learning_rate():
    specs = parse_runs("sgd, adam@0.05", DEFAULTS)
    assert [(s.label, s.optimizer, s.lr) for s in specs] == [("sgd", "sgd", 0.2), ("adam@0.05", "adam", 0.05)]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("sgd@0.1,sgd@0.1", "names a run twice: sgd@0.1, sgd@0.1"),
        ("sgd@0.2,sgd@.2", r"sgd@0.2 and sgd@.2 are one run \(sgd at lr 0.2\)"),
        ("sgd,sgd@0.2", r"sgd and sgd@0.2 are one run \(sgd at lr 0.2\)"),
        ("sgd,,adam", "has an empty item in 'sgd,,adam'"),
        ("sgd,adam,", "has an empty item"),
        ("", "--optimizers is empty"),
        ("sgd@fast", "'sgd@fast' has a learning rate 'fast' that is not a number"),
        ("lion", "unknown optimizer 'lion'; valid: sgd, adam"),
    ],
)
def test_one_run_written_twice_or_nothing_at_all_is_refused(text, message):
    with pytest.raises(ConfigError, match=message):
        parse_runs(text, DEFAULTS)
