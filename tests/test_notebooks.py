"""Every research notebook runs top to bottom on small budgets and draws its plots; none is committed with outputs."""

from __future__ import annotations

import os
from pathlib import Path

import nbclient
import nbformat
import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))


def test_the_three_notebooks_exist_without_outputs() -> None:
    assert [p.name for p in NOTEBOOKS] == [
        "extractors.ipynb",
        "rule_effectiveness.ipynb",
        "writing_a_rule.ipynb",
    ]
    for path in NOTEBOOKS:
        book = nbformat.read(path, as_version=4)
        code = [c for c in book.cells if c.cell_type == "code"]
        assert code and all(not c.outputs and c.execution_count is None for c in code), (
            f"{path.name} has outputs"
        )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes_and_plots(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONNXSAT_NOTEBOOK_QUICK", "1")  # the kernel inherits it: small budgets
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    monkeypatch.setenv("XDG_CACHE_HOME", str(Path(os.environ.get("TMPDIR", "/tmp")) / "onnxsat-nb-cache"))
    book = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        book, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    )
    client.execute()  # raises CellExecutionError on the first failing cell
    images = [
        o for c in book.cells if c.cell_type == "code" for o in c.outputs if "image/png" in o.get("data", {})
    ]
    assert images, f"{path.name} drew no plot"
    errors = [o for c in book.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
