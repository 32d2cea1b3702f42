"""The built in-tree rules are kept on disk: a new process reads them instead of building them."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from onnxsat.rules import RULES
from onnxsat.rules import table_cache as C
from onnxsat.rules.registry import IN_TREE_MODULES, SITE_RULE_MODULES, RuleTable

_FRESH = """
import json, sys
from onnxsat.rules.registry import RuleTable
table = RuleTable.default(sys.argv[1])
built = [m for m in ("onnxsat.rules.families.core", "onnxsat.rules.families.layout", "onnxsat.rules.families.views") if m in sys.modules]
rules = {n: [(e, str(b.decl)) for e, b in table.egg_rules[n]] for n in table.names()}
print(json.dumps({"families": table.families, "rules": rules, "built": built}))
"""


def _stored(tmp_path: Path) -> None:
    parts = {
        m: list(importlib.import_module(f"onnxsat.rules.{m}").FAMILIES)
        for m in IN_TREE_MODULES
        if m not in SITE_RULE_MODULES
    }
    C.store(tmp_path, parts)


def test_a_table_built_before_a_cache_was_named_is_stored_there(tmp_path: Path) -> None:
    """A process that built its rules without a cache (a batch's coordinator) fills the one it is
    given later, so the workers it starts read the rules instead of each building them."""
    assert RULES.names()  # built in this process, no cache named
    assert not C.holds_table(tmp_path)
    assert RuleTable.default(tmp_path) is RULES
    stored = C.load(tmp_path)
    assert stored is not None and set(stored) == set(IN_TREE_MODULES) - set(SITE_RULE_MODULES)


def test_a_new_process_reads_the_built_rules_instead_of_building_them(tmp_path: Path) -> None:
    _stored(tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", _FRESH, str(tmp_path)], capture_output=True, text=True, check=True
    )
    fresh = json.loads(done.stdout.splitlines()[-1])
    assert fresh["built"] == []  # no rule module was imported: nothing was built in Python
    assert fresh["families"] == RULES.families
    assert fresh["rules"] == {n: [[e, str(b.decl)] for e, b in RULES.egg_rules[n]] for n in RULES.names()}


def test_a_file_of_another_version_or_damaged_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from onnxsat.base import disk_cache

    _stored(tmp_path)
    path = tmp_path / C.TABLE_FILE
    raw = disk_cache.read(path)
    assert raw is not None
    assert C.load(tmp_path) is not None
    with monkeypatch.context() as m:
        m.setattr(C, "listing_key", lambda: "another version")
        assert C.load(tmp_path) is None  # written by another version (key) : built again
    disk_cache.write(path, b"not json")
    assert C.load(tmp_path) is None
    path.write_bytes(raw[:-10])  # truncated: the checksum fails
    assert C.load(tmp_path) is None


@pytest.mark.parametrize("name", ["system", "os.system", "Path", "dataclass", "__class__"])
def test_a_planted_file_builds_nothing_but_declarations(tmp_path: Path, name: str) -> None:
    from onnxsat.base import disk_cache

    marker = tmp_path / "ran"
    planted = {
        "format": C.FORMAT,
        "key": C.listing_key(),
        "modules": {},
        "analysis": [[0, [], []]],
        "classes": [name],
        "nodes": [[3, 0, f"touch {marker}"]],
    }
    disk_cache.write(tmp_path / C.TABLE_FILE, json.dumps(planted).encode())
    assert C.load(tmp_path) is None  # not an egglog declaration class: refused
    assert not marker.exists()


@pytest.mark.parametrize(
    "nodes",
    [
        [[0, 1], [0]],  # a node names a later one (a cycle, or past the end)
        [[3, 5]],  # a class index past the list
        [[7, 0]],  # an unknown node kind
        [[0, [1, 2]]],  # a malformed literal
    ],
)
def test_a_file_with_malformed_nodes_is_refused_at_load(tmp_path: Path, nodes: list) -> None:
    from onnxsat.base import disk_cache

    planted = {
        "format": C.FORMAT,
        "key": C.listing_key(),
        "modules": {},
        "analysis": [[0, [], []]],
        "classes": ["LitDecl"],
        "nodes": nodes,
    }
    disk_cache.write(tmp_path / C.TABLE_FILE, json.dumps(planted).encode())
    assert C.load(tmp_path) is None  # refused before any rule is built, not when a run builds one
