"""Every public docstring example runs and prints what it claims (doctest)."""

from __future__ import annotations

import doctest

import pytest

import jax_topk
from jax_topk import _indexer, _info, _ragged, _sort, _topk, routing

MODULES = [_topk, _sort, _ragged, _info, _indexer, routing]


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_docstring_examples(module):
    failures, tried = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert tried > 0, f"{module.__name__} has no examples"
    assert failures == 0


def public_callables():
    """Every public function and class: jax_topk's, and those the public
    submodules (routing, nsa) define."""
    found = [(f"jax_topk.{n}", getattr(jax_topk, n)) for n in jax_topk.__all__]
    for module in (routing, jax_topk.nsa):
        found += [(f"{module.__name__}.{n}", obj) for n, obj in vars(module).items()
                  if not n.startswith("_") and getattr(obj, "__module__", None) == module.__name__]
    return [(name, obj) for name, obj in found if callable(obj)]


@pytest.mark.parametrize("name,obj", public_callables(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_public_function_has_an_example(name, obj):
    assert obj.__doc__ and ">>>" in obj.__doc__, f"{name} has no docstring example"


def test_readme_performance_tables_are_the_recorded_results():
    # README's tables are generated from benchmarks/results (benchmarks/report.py --write):
    # a recorded run that changes, or a hand edit of the tables, fails here.
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "report.py"
    spec = importlib.util.spec_from_file_location("report", path)
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    readme = report.README.read_text()
    assert report.readme_block(readme) == report.markdown(), "run: python benchmarks/report.py --write"
    for name in report.README_RESULTS:  # every table names its device and its file
        result = report.load(name)
        assert result["device"] in readme and f"benchmarks/results/{name}" in readme
