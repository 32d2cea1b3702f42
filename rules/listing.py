"""The rule table as plain data, cached on disk so ``onnxsat rules list`` builds no egglog rule.

A row is what ``rule_pattern.describe_rule`` says of a rule (name, family, each egglog rule's
terms and guards as text) plus its source. Building the rows needs the built table (seconds of
egglog rule construction); the in-tree rows are therefore kept in ``LISTING_FILE``, keyed by the
onnxsat and egglog versions and a hash of the sources the rules are built from (``rules/`` and
``egraph/``), and that key is checked on every load: a missing, damaged or stale file is rebuilt.
This module imports no egglog, so reading the cache costs milliseconds.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .registry import RuleTable

ENTRY_POINT_GROUP = "onnxsat.rules"
"""The entry-point group installed rule plugins are found under."""
LISTING_FILE = "rule-listing.json"

_SOURCES = (Path(__file__).resolve().parent, Path(__file__).resolve().parent.parent / "egraph")
"""Where the in-tree rules and the language and analyses they are written in live (the package
directories of ``onnxsat.rules`` and ``onnxsat.egraph``)."""


def installed_plugins() -> bool:
    """Whether any rule plugin is installed (entry points; looked up without importing them)."""
    return bool(list(metadata.entry_points(group=ENTRY_POINT_GROUP)))


def listing_key() -> str:
    """What the in-tree rows depend on: versions of onnxsat and egglog, and the rule sources."""
    digest = hashlib.sha256()
    for name in ("onnxsat", "egglog"):
        try:
            digest.update(f"{name}={metadata.version(name)};".encode())
        except metadata.PackageNotFoundError:
            digest.update(f"{name}=?;".encode())
    for root in _SOURCES:
        for path in sorted(root.rglob("*.py")):
            digest.update(str(path.relative_to(root.parent)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def rows_of(table: RuleTable) -> list[dict[str, Any]]:
    """One row per rule of ``table``, in table order (builds nothing the table has not built)."""
    from .rule_pattern import describe_rule

    rows = []
    for name in table.names():
        row = describe_rule(table, name)
        row["source"] = table.source_of(name)
        rows.append(row)
    return rows


def in_tree_rows(cache_dir: str | Path | None) -> list[dict[str, Any]]:
    """The in-tree table's rows: from ``cache_dir`` when its file has this key, else built and stored."""
    key = listing_key()
    path = Path(cache_dir) / LISTING_FILE if cache_dir is not None else None
    if path is not None:
        try:
            cached = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(cached, dict) and cached.get("key") == key and isinstance(cached.get("rows"), list):
                return cached["rows"]
        except (OSError, ValueError):
            pass  # missing or damaged: build the rows again
    from .registry import RuleTable

    rows = rows_of(RuleTable.default(cache_dir))
    if path is not None:
        write_atomic(path, json.dumps({"key": key, "rows": rows}).encode())
    return rows


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` via a temporary file and a rename; a cache that cannot be written only costs time."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError:
        pass
