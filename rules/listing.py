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
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from onnxsat.base import disk_cache

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
    from .verification.rule_pattern import describe_rule

    rows = []
    for name in table.names():
        row = describe_rule(table, name)
        row["source"] = table.source_of(name)
        rows.append(row)
    return rows


def in_tree_rows(cache_dir: str | Path | None) -> list[dict[str, Any]]:
    """The in-tree table's rows: from ``cache_dir`` when its entry has this key, else built and stored
    (only in a private directory, through ``base.disk_cache``)."""
    key = listing_key()
    directory = disk_cache.private_dir(cache_dir) if cache_dir is not None else None
    if directory is not None:
        payload = disk_cache.read(directory / LISTING_FILE)
        try:
            cached = json.loads(payload) if payload is not None else None
        except ValueError:
            cached = None  # damaged: build the rows again
        if isinstance(cached, dict) and cached.get("key") == key and isinstance(cached.get("rows"), list):
            return cached["rows"]
    from .registry import RuleTable

    rows = rows_of(RuleTable.default(cache_dir))
    if directory is not None:
        disk_cache.write(directory / LISTING_FILE, json.dumps({"key": key, "rows": rows}).encode())
    return rows
