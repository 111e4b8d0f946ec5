"""Labels of the report's lines: several directories on one chart never share a label."""

from types import SimpleNamespace

from optiscope.report.sections import distinct_names, labelled


def test_directories_of_one_name_are_told_apart_by_their_parents(tmp_path):
    paths = [tmp_path / "old" / "lm", tmp_path / "new" / "lm", tmp_path / "x" / "eos"]
    assert distinct_names(paths) == ["old/lm", "new/lm", "eos"]
    deeper = [tmp_path / "x" / "a" / "lm", tmp_path / "y" / "a" / "lm", tmp_path / "b" / "lm"]
    assert distinct_names(deeper) == ["x/a/lm", "y/a/lm", "b/lm"]


def test_every_run_of_several_directories_gets_its_own_label(tmp_path):
    group = [SimpleNamespace(path=tmp_path / d / "lm") for d in ("a", "b")]
    labels = [f("adamw") for f, _ in labelled(group)]
    assert labels == ["a/lm: adamw", "b/lm: adamw"]
    (alone,) = [f("adamw") for f, _ in labelled(group[:1])]
    assert alone == "adamw"
