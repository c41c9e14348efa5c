"""The teaching notebooks execute without error (CPU backend here; the same code runs on a GPU).

Each notebook runs in a fresh ipykernel of *this* interpreter (a kernelspec installed into a
temporary prefix, so a fresh virtual environment needs nothing registered), in a temporary working
directory, with matplotlib's inline backend (Agg rendering to PNG, headless; plain ``MPLBACKEND=Agg``
would make ``plt.show()`` a no-op, so no figure would ever be drawn and drawing errors would pass
unnoticed). The committed notebooks must be what
``notebooks/make_notebooks.py`` writes, with outputs stripped.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = REPO / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
CELL_TIMEOUT_S = 300
KERNEL_NAME = "python3"


@pytest.fixture(scope="module")
def kernel_manager_factory(tmp_path_factory):
    """Kernel managers that start ``python3`` = this interpreter, whatever is registered globally."""
    from ipykernel.kernelspec import install
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    prefix = tmp_path_factory.mktemp("kernelspec")
    install(kernel_name=KERNEL_NAME, prefix=str(prefix))  # argv[0] = sys.executable
    kernels = prefix / "share" / "jupyter" / "kernels"
    spec_manager = KernelSpecManager(kernel_dirs=[str(kernels)])
    assert spec_manager.get_kernel_spec(KERNEL_NAME).argv[0] == sys.executable

    def make():
        return KernelManager(kernel_name=KERNEL_NAME, kernel_spec_manager=spec_manager)

    return make


def test_notebooks_exist():
    names = [p.name for p in NOTEBOOKS]
    assert names == [
        "01_float_addition_is_not_associative.ipynb",
        "02_split_kv_attention_and_position_384.ipynb",
        "03_replay_and_speculative_decoding.ipynb",
    ]


def test_committed_notebooks_are_generated_and_stripped():
    sys.path.insert(0, str(NOTEBOOK_DIR))
    try:
        import make_notebooks
    finally:
        sys.path.remove(str(NOTEBOOK_DIR))
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert not cell.outputs and cell.execution_count is None, f"{path.name}: outputs not stripped"
        assert path.read_text() == make_notebooks.render(path.name), (
            f"{path.name} differs from notebooks/make_notebooks.py: run `python notebooks/make_notebooks.py`")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes(path, kernel_manager_factory, tmp_path, monkeypatch):
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    # the kernel imports hiraishin from this checkout even where it is not installed
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, km=kernel_manager_factory(), timeout=CELL_TIMEOUT_S,
                                     resources={"metadata": {"path": str(tmp_path)}})
    t0 = time.perf_counter()
    # raises CellExecutionError (with the traceback) on the first failing cell; cleanup_kc: shut the
    # kernel down afterwards (nbclient only does that by itself for kernel managers it created)
    client.execute(cleanup_kc=True)
    elapsed = time.perf_counter() - t0
    print(f"{path.name}: {elapsed:.1f} s")
    errors = [out for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs
              if out.output_type == "error"]
    assert not errors
    assert any(out.get("output_type") == "display_data" and "image/png" in out.get("data", {})
               for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs), "no figure was drawn"
