"""The API reference stays complete: every public name is documented as a reference, and every example runs.

"Public" is each package's ``__all__``. The docstrings are read with griffe, the parser mkdocstrings renders
the API pages with, in the one style the project uses (Google), so what passes here is what the pages show.
"""

import doctest
import importlib
import inspect
import pkgutil

import griffe
import pytest

import optiscope

# the packages whose __all__ is the public API (integrations are modules: their library is imported at the top)
PUBLIC = (
    "optiscope",
    "optiscope.optim",
    "optiscope.reference",
    "optiscope.curvature",
    "optiscope.monitor",
    "optiscope.probe",
    "optiscope.train",
    "optiscope.experiments",
    "optiscope.sweep",
    "optiscope.report",
    "optiscope.data",
    "optiscope.models",
    "optiscope.integrations.transformers",
    "optiscope.integrations.lightning",
)
ROOT = griffe.load("optiscope", docstring_parser="google", resolve_aliases=False, force_inspection=False)
NO_ARGS = {"self", "cls"}


def public_names() -> list[tuple[str, str]]:
    return [(package, name) for package in PUBLIC for name in importlib.import_module(package).__all__]


def resolved(package: str, name: str) -> griffe.Object:
    path = package.removeprefix("optiscope").lstrip(".")
    obj = ROOT[f"{path}.{name}"] if path else ROOT[name]
    obj = obj.final_target if obj.is_alias else obj
    if obj.is_module and not inspect.ismodule(getattr(importlib.import_module(package), name)):
        obj = obj[name]  # a function named as its module (curvature.sharpness): griffe finds the module first
    return obj


def sections(obj: griffe.Object) -> dict[str, list]:
    found: dict[str, list] = {}
    for section in obj.docstring.parse(griffe.Parser.google):
        found.setdefault(section.kind.value, []).append(section)
    return found


def documented_parameters(found: dict[str, list]) -> set[str]:
    names = set()
    for section in found.get("parameters", []) + found.get("other parameters", []):
        names |= {p.name.lstrip("*") for p in section.value}
    return names


def signature_parameters(obj: griffe.Object) -> list[str]:
    return [p.name for p in obj.parameters if p.name not in NO_ARGS]


@pytest.mark.parametrize(("package", "name"), public_names(), ids=lambda x: x)
def test_public_name_is_documented_as_a_reference(package, name):
    obj = resolved(package, name)
    assert obj.docstring is not None and obj.docstring.value.strip(), f"{package}.{name} has no docstring"
    lines = obj.docstring.value.strip().splitlines()
    assert lines[0].strip(), f"{package}.{name}: the docstring opens with a blank line"
    assert len(lines) == 1 or not lines[1].strip(), f"{package}.{name}: the summary is not one line"
    if obj.kind not in (griffe.Kind.FUNCTION, griffe.Kind.CLASS):
        return  # a constant or a type alias: a summary (and whatever follows) is its reference
    found = sections(obj)
    missing = [p for p in signature_parameters(obj) if p not in documented_parameters(found)]
    assert not missing, f"{package}.{name} leaves parameters undocumented: {missing}"
    if obj.kind is griffe.Kind.FUNCTION and obj.returns not in (None, "None"):
        assert "returns" in found or "yields" in found, f"{package}.{name} does not say what it returns"
    assert "examples" in found, f"{package}.{name} has no Examples section"


def doctests() -> list[doctest.DocTest]:
    """Every ``>>>`` example in optiscope's source (public or not), in the module it belongs to."""
    modules = [optiscope] + [
        importlib.import_module(m.name)
        for m in pkgutil.walk_packages(optiscope.__path__, "optiscope.")
        if not m.name.endswith("__main__")
    ]
    finder = doctest.DocTestFinder(exclude_empty=True)
    found = {t.name: t for module in modules for t in finder.find(module) if t.examples}
    return sorted(found.values(), key=lambda t: t.name)


@pytest.mark.parametrize("test", doctests(), ids=lambda t: t.name)
def test_docstring_example_runs(test, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # an example that writes files writes them here
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    test.globs = dict(test.globs)
    runner.run(test, out=lambda s: None)
    failures = runner.summarize(verbose=False).failed
    if failures:
        report: list[str] = []
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
        runner.run(test, out=report.append)
        pytest.fail("".join(report), pytrace=False)
