"""The registry: what is compiled, and the FFI-version guard."""

from __future__ import annotations

import types

import jaxlib

import jax_topk
from jax_topk import _registry


def test_info_reports_the_cpu_module():
    info = jax_topk.info()
    cpu = info["platforms"]["cpu"]
    assert cpu["native"] and cpu["ffi_platform"] == "cpu"
    ops = ("top_k", "top_k_lengths", "sort", "sort_lengths", "route", "indexer")
    internal = ("route_softmax_partial",)  # a piece of the expert-sharded route, not an op of its own
    assert cpu["targets"] == {op: f"jax_topk_{op}" for op in ops + internal}
    assert cpu["op_dtypes"]["route"] == ["float32", "bfloat16", "float16"]
    assert cpu["op_dtypes"]["indexer"] == ["float32", "bfloat16"]
    assert cpu["op_dtypes"]["top_k"] == cpu["dtypes"]
    assert tuple(cpu["build"]["ffi_api_version"]) >= (0, 3)
    assert info["backend"] in ("cpu", "gpu", "cuda")
    assert set(info["paths"]) == set(ops) | {"nsa_block_scores"}  # a GPU-only kernel: never on the CPU module
    assert "nsa_block_scores" not in cpu["targets"]


def test_module_built_against_newer_ffi_headers_is_not_registered(monkeypatch):
    # A handler compiled against a newer FFI API than the runtime's can take
    # the backend down: such a module must be skipped with a reason.
    registered = []
    fake = types.SimpleNamespace(
        build_info=lambda: {"ffi_headers_jaxlib": "99.0.0", "ffi_api_version": (9, 9)},
        platform=lambda: "cpu",
        targets=lambda: {"top_k": ("should_not_register", object())},
        dtypes=lambda: ["float32"],
    )
    monkeypatch.setattr(_registry.importlib, "import_module", lambda name: fake)
    monkeypatch.setattr(_registry.jax.ffi, "register_ffi_target", lambda *a, **k: registered.append(a))
    monkeypatch.setattr(_registry, "_unavailable", {})
    monkeypatch.setattr(_registry, "_loaded", {})
    _registry._load("fakeplatform", "fake_module")
    assert registered == []
    assert "fakeplatform" not in _registry._loaded
    reason = _registry._unavailable["fakeplatform"]
    assert "99.0.0" in reason and jaxlib.__version__ in reason


def test_kernel_target_is_none_for_dtypes_without_kernel():
    assert _registry.kernel_target("top_k", "cpu", "float32") == "jax_topk_top_k"
    assert _registry.kernel_target("top_k", "cpu", "bool") is None
    assert _registry.kernel_target("no_such_op", "cpu", "float32") is None
    assert _registry.kernel_target("top_k", "no_such_platform", "float32") is None


def test_source_checkout_uses_the_installed_compiled_modules(monkeypatch):
    # `python -m jax_topk` in a checkout imports the source tree, which holds no
    # compiled module: the registry then loads the installed distribution's.
    path = _registry._installed_extension("jax_topk._jax_topk_cpu")
    assert path is not None and path.endswith((".so", ".pyd"))

    def no_module(name):
        raise ImportError(f"No module named {name!r}")

    monkeypatch.setattr(_registry.importlib, "import_module", no_module)
    module, location = _registry._import_native("jax_topk._jax_topk_cpu")
    assert location.startswith(path) and "installed distribution" in location
    assert "top_k" in module.targets()
