"""What is compiled, and its registration with JAX.

Each platform has one native module (``_jax_topk_cpu``, ``_jax_topk_cuda``,
``_jax_topk_rocm``)
built from ``ffi/module.cc``. It exports its FFI targets ``{op: (target name,
capsule)}``, the dtypes its kernels handle, and how it was built. This module
imports the ones that exist, registers their targets with ``jax.ffi`` and
answers "which kernel serves (op, platform, dtype)?" for the lowering rules.
Target names and dtype lists are defined once, in C++ (``ffi/targets.h``,
``csrc/include/jax_topk/dtypes.h``), and only read here.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import importlib.util
import os
import re
import sys

import jax
import jaxlib
import numpy as np

# lowering platform name (as in mlir.register_lowering) -> native module
_MODULES = {"cpu": "jax_topk._jax_topk_cpu", "cuda": "jax_topk._jax_topk_cuda", "rocm": "jax_topk._jax_topk_rocm"}


@dataclasses.dataclass(frozen=True)
class NativeModule:
    platform: str  # lowering platform: "cpu", "cuda", "rocm"
    ffi_platform: str  # platform the targets are registered for: "cpu", "CUDA", "ROCM"
    targets: dict[str, str]  # op family -> FFI target name
    dtypes: tuple[str, ...]
    op_dtypes: dict[str, tuple[str, ...]]  # op family -> dtypes its kernels read
    build: dict
    module: object  # the nanobind module itself


_loaded: dict[str, NativeModule] = {}
_unavailable: dict[str, str] = {}


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", v)[:3])


def _installed_extension(module_name: str) -> str | None:
    """The compiled module of the installed jax_topk distribution, if any.

    ``python -m jax_topk`` (or ``python -c``) run in a source checkout puts the
    checkout first on sys.path, so ``jax_topk`` is the source tree, which holds
    no compiled modules; the ones ``pip install .`` built are in site-packages.
    """
    try:
        files = importlib.metadata.distribution("jax_topk").files or []
    except importlib.metadata.PackageNotFoundError:
        return None
    stem = module_name.rsplit(".", 1)[-1]
    for f in files:
        if f.parts[0] == "jax_topk" and f.name.startswith(stem + ".") and f.suffix in (".so", ".pyd"):
            path = str(f.locate())
            if os.path.exists(path):
                return path
    return None


def _import_native(module_name: str):
    """Imports a compiled module; returns (module, where it was loaded from)."""
    try:
        module = importlib.import_module(module_name)
        return module, getattr(module, "__file__", module_name)
    except ImportError:
        path = _installed_extension(module_name)
        if path is None:
            raise
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[module_name] = module
        return module, f"{path} (installed distribution; jax_topk itself imported from {os.path.dirname(__file__)})"


def _load(platform: str, module_name: str) -> None:
    try:
        module, location = _import_native(module_name)
    except ImportError as e:
        _unavailable[platform] = f"not compiled ({e})"
        return
    build = dict(module.build_info(), loaded_from=location)
    # A handler compiled against a newer FFI API than the runtime's is
    # rejected, and can take the whole backend down: never register it.
    if _version(jaxlib.__version__) < _version(build["ffi_headers_jaxlib"]):
        _unavailable[platform] = (
            f"compiled against the XLA FFI headers of jaxlib {build['ffi_headers_jaxlib']}, "
            f"but jaxlib {jaxlib.__version__} is older; rebuild jax_topk against it"
        )
        return
    targets = {}
    for op, (target, capsule) in module.targets().items():
        jax.ffi.register_ffi_target(target, capsule, platform=module.platform())
        targets[op] = target
    _loaded[platform] = NativeModule(
        platform=platform,
        ffi_platform=module.platform(),
        targets=targets,
        dtypes=tuple(module.dtypes()),
        op_dtypes={op: tuple(names) for op, names in module.op_dtypes().items()},
        build=build,
        module=module,
    )


for _platform, _module_name in _MODULES.items():
    _load(_platform, _module_name)


def platforms() -> tuple[str, ...]:
    """Lowering platforms with a native module loaded and registered."""
    return tuple(_loaded)


def kernel_target(op: str, platform: str, dtype) -> str | None:
    """The FFI target serving (op, platform, dtype), or None (use the fallback)."""
    module = _loaded.get(platform)
    if module is None or op not in module.targets or np.dtype(dtype).name not in module.op_dtypes[op]:
        return None
    return module.targets[op]


def workspace_bytes(op: str, platform: str, dtype, rows: int, n: int, k: int) -> int | None:
    """Bytes of workspace the platform's kernel for ``op`` takes as an extra
    result buffer, or None when its handler takes none (CPU handlers)."""
    module = _loaded[platform].module
    if not hasattr(module, "workspace_bytes"):
        return None
    return int(module.workspace_bytes(op, np.dtype(dtype).name, rows, n, k))


def indexer_plan(platform: str, dtype, batch: int, heads: int, n: int, dim: int, k: int,
                 fusion: str) -> dict | None:
    """How the platform's indexer kernel runs this shape (``workspace_bytes``,
    ``tensor_cores``, ``fused``, ``chunk_keys``, ``fused_max_k``; see
    ``ffi/module.cc``), or None when its handler takes no workspace (CPU)."""
    module = _loaded[platform].module
    if not hasattr(module, "indexer_plan"):
        return None
    value = module.indexer_fusions()[fusion]
    plan = dict(module.indexer_plan(np.dtype(dtype).name, batch, heads, n, dim, k, value))
    return dict(plan, fusion=value)


def nsa_block_scores_unsupported(platform: str, groups: int, dim: int, block_size: int, stride: int,
                                 select_size: int) -> str | None:
    """Why the platform's NSA block-score kernel cannot take these sizes
    (``jax_topk/nsa.h``), or None when it can (a reason too when the
    platform's module has no such kernel)."""
    module = _loaded.get(platform)
    if module is None or "nsa_block_scores" not in module.targets:
        return f"no {platform} module with the NSA block-score kernel"
    return module.module.nsa_block_scores_unsupported(groups, dim, block_size, stride, select_size) or None


def build_info(platform: str) -> dict:
    """The platform module's build_info() (empty when it is not loaded)."""
    module = _loaded.get(platform)
    return dict(module.build) if module else {}


def describe() -> dict:
    """Per platform: whether it is compiled, its targets, dtypes and build."""
    out = {}
    for platform in _MODULES:
        if platform in _loaded:
            m = _loaded[platform]
            out[platform] = {
                "native": True,
                "ffi_platform": m.ffi_platform,
                "targets": dict(m.targets),
                "dtypes": list(m.dtypes),
                "op_dtypes": {op: list(d) for op, d in m.op_dtypes.items()},
                "build": dict(m.build),
            }
        else:
            out[platform] = {"native": False, "reason": _unavailable.get(platform, "unknown")}
    return out
