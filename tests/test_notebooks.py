"""The notebooks in ``notebooks/`` run as tests (DESIGN section 7).

Each notebook is executed top to bottom with ``nbclient`` in a fresh ``python3``
kernel whose working directory is ``notebooks/`` (the notebooks read files
relative to it); any cell error fails the test. The notebooks assert the
properties they demonstrate, so a change that breaks one fails here.

The kernel is ipykernel on the interpreter running pytest (not whatever
``python3`` kernelspec a machine happens to have installed), so the notebooks
import the same ``jax_topk`` build as the rest of the suite; a first cell,
added at run time only, checks that.

``JAX_TOPK_NOTEBOOK_OUT=DIR`` keeps each executed notebook (with its outputs) in DIR.

The notebooks are stored without outputs (``test_stored_without_outputs``):
regenerate them from a clean kernel, then clear the outputs before committing
(``jupyter nbconvert --clear-output --inplace notebooks/*.ipynb``).

Needs the ``test`` extra: ``pip install ".[test]"`` (nbclient, nbformat, ipykernel, matplotlib).
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

# The "test" extra (pip install ".[test]") brings these: a missing one fails, it does not skip.
import ipykernel.kernelspec as ipykernel_spec
import jupyter_client
import matplotlib  # noqa: F401  (the notebooks plot)
import nbclient
import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpec, KernelSpecManager

NOTEBOOK_DIR = pathlib.Path(__file__).resolve().parent.parent / "notebooks"
KERNEL_NAME = "python3"
CELL_TIMEOUT_S = 900          # per cell: generous for a loaded 2-core CI machine
# Set by conftest.py for the sharding tests; the notebooks should see the plain single-device CPU.
_TEST_ONLY_XLA_FLAG = "--xla_force_host_platform_device_count"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")   # colour codes in the kernel's tracebacks


def _git_notebooks() -> set[pathlib.Path]:
    """Notebooks that git tracks in notebooks/ (none outside a git checkout)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--", "*.ipynb"], cwd=NOTEBOOK_DIR,
                             capture_output=True, check=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return set()
    return {NOTEBOOK_DIR / p for p in out.split("\0") if p and "/" not in p}


NOTEBOOKS = sorted(set(NOTEBOOK_DIR.glob("*.ipynb")) | _git_notebooks())


class _ThisInterpreter(KernelSpecManager):
    """Resolves the ``python3`` kernel to ipykernel on ``sys.executable``.

    jupyter_client does the same for its native kernel only when no other
    ``python3`` kernelspec is installed in a Jupyter data directory; a user- or
    system-wide one may point at another interpreter.
    """

    def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
        if kernel_name != KERNEL_NAME:
            return super().get_kernel_spec(kernel_name)
        return KernelSpec(resource_dir=ipykernel_spec.RESOURCES, **ipykernel_spec.get_kernel_dict())


def _kernel_env() -> dict[str, str]:
    env = dict(os.environ)
    flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith(_TEST_ONLY_XLA_FLAG)]
    if flags:
        env["XLA_FLAGS"] = " ".join(flags)
    else:
        env.pop("XLA_FLAGS", None)
    # On a GPU this test process already holds XLA's preallocated pool (75% of the memory):
    # the kernel allocates as it goes from the rest.
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    # Headless: figures render to PNG outputs (what Jupyter itself sets), never to a window.
    env["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    return env


def _interpreter_check_cell() -> nbformat.NotebookNode:
    """A first cell (run time only) asserting the kernel runs this interpreter and jax_topk build."""
    import jax_topk

    return nbformat.v4.new_code_cell(
        "import sys, os, jax_topk\n"
        f"assert os.path.samefile(sys.executable, {sys.executable!r}), sys.executable\n"
        f"assert sys.prefix == {sys.prefix!r}, sys.prefix\n"
        f"assert os.path.samefile(jax_topk.__file__, {jax_topk.__file__!r}), jax_topk.__file__\n"
    )


def test_notebooks_exist():
    if not NOTEBOOK_DIR.is_dir():
        pytest.skip(f"{NOTEBOOK_DIR} is not here (not a source checkout)")
    assert NOTEBOOKS, f"no notebooks found in {NOTEBOOK_DIR}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_stored_without_outputs(path: pathlib.Path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    dirty = [i for i, cell in enumerate(nb.cells) if cell.cell_type == "code"
             and (cell.get("outputs") or cell.get("execution_count") is not None)]
    assert not dirty, (f"{path.name}: code cells {dirty} hold outputs or execution counts; clear them "
                       f"(Jupyter's 'Clear All Outputs', or jupyter nbconvert --clear-output --inplace {path})")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path: pathlib.Path):
    nb = nbformat.read(path, as_version=4)
    nb.cells.insert(0, _interpreter_check_cell())
    km = jupyter_client.AsyncKernelManager(kernel_name=KERNEL_NAME, kernel_spec_manager=_ThisInterpreter())
    client = nbclient.NotebookClient(
        nb, km=km, kernel_name=KERNEL_NAME, timeout=CELL_TIMEOUT_S, allow_errors=False,
        resources={"metadata": {"path": str(NOTEBOOK_DIR)}},
    )
    error = None
    try:
        client.execute(env=_kernel_env())
    except nbclient.exceptions.CellExecutionError as err:
        error = _ANSI.sub("", str(err))
    if os.environ.get("JAX_TOPK_NOTEBOOK_OUT"):  # keep the executed notebook (e.g. from a GPU run)
        out = pathlib.Path(os.environ["JAX_TOPK_NOTEBOOK_OUT"])
        out.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, out / path.name)
    if error is not None:   # outside the except block: no chained traceback
        pytest.fail(f"{path.name}: a cell failed (execution counts include the interpreter check):\n{error}",
                    pytrace=False)
