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


@pytest.mark.parametrize("name", jax_topk.__all__)
def test_every_public_function_has_an_example(name):
    obj = getattr(jax_topk, name)
    if callable(obj):
        assert obj.__doc__ and ">>>" in obj.__doc__, f"jax_topk.{name} has no docstring example"
