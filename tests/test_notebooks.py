"""Every research notebook is committed with the outputs of its code, and still runs top to bottom on small budgets and draws its plots."""

from __future__ import annotations

import os
from pathlib import Path

import nbclient
import nbformat
import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))


def test_the_three_notebooks_are_committed_with_the_outputs_of_their_code() -> None:
    """A reader sees every table and plot without running anything, and the outputs are those of
    the code beside them (notebooks/execute.py records the code's hash when it saves them)."""
    from notebooks.execute import code_hash

    assert [p.name for p in NOTEBOOKS] == [
        "extractors.ipynb",
        "rule_effectiveness.ipynb",
        "writing_a_rule.ipynb",
    ]
    for path in NOTEBOOKS:
        book = nbformat.read(path, as_version=4)
        code = [c for c in book.cells if c.cell_type == "code"]
        assert book.metadata.get("onnxsat", {}).get("code_sha256") == code_hash(book), (
            f"{path.name}: code changed since its outputs were saved (run python notebooks/execute.py)"
        )
        assert [c.execution_count for c in code] == list(range(1, len(code) + 1)), f"{path.name}: not run in order"
        outputs = [o for c in code for o in c.outputs]
        assert any("image/png" in o.get("data", {}) for o in outputs), f"{path.name} shows no plot"
        assert not [o for o in outputs if o.output_type == "error"], f"{path.name} saved an error"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes_and_plots(path: Path, monkeypatch: pytest.MonkeyPatch, rule_cache_dir: Path) -> None:
    monkeypatch.setenv("ONNXSAT_NOTEBOOK_QUICK", "1")  # the kernel inherits it: small budgets
    monkeypatch.setenv("ONNXSAT_CACHE_DIR", str(rule_cache_dir))  # the kernel reads the built rules
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
