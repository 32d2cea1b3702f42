"""Execute the research notebooks top to bottom and save them with their outputs (plots included),
so a reader sees every figure without running anything.

Each saved notebook records in its metadata (``onnxsat``) a hash of its code cells, the budgets it
ran under (``quick``: the test suite's small budgets; otherwise full budgets and 30 latency
rounds), the load average around the run and the onnxsat version; tests/test_notebooks.py fails
when a committed notebook's code no longer matches the outputs saved with it.

    python notebooks/execute.py                    # every notebook, full budgets
    python notebooks/execute.py --quick extractors # one notebook, the test suite's budgets
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from pathlib import Path

import nbclient
import nbformat

HERE = Path(__file__).resolve().parent


def code_hash(book: nbformat.NotebookNode) -> str:
    """sha256 of the code cells' sources, in order: what the saved outputs were computed from."""
    digest = hashlib.sha256()
    for cell in book.cells:
        if cell.cell_type == "code":
            digest.update(cell.source.encode())
            digest.update(b"\0")
    return digest.hexdigest()


def execute(path: Path, quick: bool, timeout: int = 3600) -> nbformat.NotebookNode:
    """Run ``path`` in a fresh kernel (from the notebooks folder) and return it with its outputs."""
    book = nbformat.read(path, as_version=4)
    os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"  # the kernel inherits it
    if quick:
        os.environ["ONNXSAT_NOTEBOOK_QUICK"] = "1"
    else:
        os.environ.pop("ONNXSAT_NOTEBOOK_QUICK", None)
    load_before = os.getloadavg()
    client = nbclient.NotebookClient(
        book, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    )
    client.execute()
    import onnxsat

    book.metadata["onnxsat"] = {
        "code_sha256": code_hash(book),
        "budgets": "quick" if quick else "full",
        "load_average": [round(v, 2) for v in (*load_before, *os.getloadavg())],
        "version": onnxsat.__version__,
    }
    return book


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help="notebook names (default: all)")
    parser.add_argument("--quick", action="store_true", help="the test suite's small budgets")
    args = parser.parse_args(argv)
    paths = sorted(HERE.glob("*.ipynb"))
    if args.names:
        paths = [p for p in paths if p.stem in args.names]
    for path in paths:
        book = execute(path, args.quick)
        tmp = path.with_suffix(".ipynb.tmp")
        nbformat.write(book, tmp)
        tmp.replace(path)
        print(f"{path.name}: executed ({book.metadata['onnxsat']['budgets']} budgets)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
