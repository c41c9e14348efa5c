"""Build the notebooks (``NN_*.ipynb``) from their jupytext percent-format sources (``NN_*.py``).

    python notebooks/build.py            # rewrite every .ipynb from its .py
    python notebooks/build.py --check    # exit 1 if a committed .ipynb differs from its source

The ``.py`` files are the sources: edit, lint (``ruff check notebooks``) and import those. The
``.ipynb`` files are committed without outputs, with deterministic cell ids, so a rebuild of an
unchanged source gives the same bytes; run one to see its outputs (or ``pytest tests/test_notebooks.py``,
which executes every notebook built from its source).
"""

from __future__ import annotations

import sys
from pathlib import Path

import jupytext
import nbformat

HERE = Path(__file__).resolve().parent
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}


def sources() -> list[Path]:
    """The notebook sources, in order: files named like ``01_something.py``."""
    return sorted(p for p in HERE.glob("[0-9][0-9]_*.py"))


def build(source: Path) -> nbformat.NotebookNode:
    """The notebook of one source: cells as jupytext reads them, no outputs, ids ``NN-cell-KK``."""
    nb = jupytext.read(source, fmt="py:percent")
    nb.metadata = {"kernelspec": dict(KERNELSPEC), "language_info": {"name": "python"}}
    stem = source.name[:2]
    for i, cell in enumerate(nb.cells):
        cell.id = f"nb{stem}-{i:02d}"
        cell.metadata = {}
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nbformat.validate(nb)
    return nb


def render(source: Path) -> str:
    return nbformat.writes(build(source)) + "\n"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    check = "--check" in argv
    stale = []
    for source in sources():
        target = source.with_suffix(".ipynb")
        text = render(source)
        if check:
            if not target.exists() or target.read_text() != text:
                stale.append(target.name)
        elif not target.exists() or target.read_text() != text:
            target.write_text(text)
            print(f"wrote {target.relative_to(HERE.parent)}")
    if stale:
        print("out of date (run python notebooks/build.py):", ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
