"""jax_topk: exact, deterministic top-k for JAX on CPU and GPU.

Every op orders elements by the IEEE-754 total order with ties broken by lower
index, and gives bit-identical results on every backend (``lax.top_k`` on CPU
gives the same). See ``jax_topk.info()`` for what is compiled here.
"""

from __future__ import annotations

from jax_topk import nsa, routing
from jax_topk._indexer import indexer_top_k
from jax_topk._info import info
from jax_topk._ragged import ragged_sort, ragged_top_k
from jax_topk._sort import argsort, sort
from jax_topk._topk import top_k
from jax_topk._version import __version__

__all__ = ["__version__", "argsort", "indexer_top_k", "info", "nsa", "ragged_sort", "ragged_top_k", "routing", "sort", "top_k"]
