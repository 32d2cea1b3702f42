"""`onnxsat rules list` reads the in-tree rule table as plain data: no egglog rule is built for it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from onnxsat.base import disk_cache
from onnxsat.rules import RULES
from onnxsat.rules.listing import LISTING_FILE, in_tree_rows, listing_key, rows_of

_LIST_AND_REPORT_IMPORTS = """
import contextlib, io, json, sys
from onnxsat import cli
out = io.StringIO()
with contextlib.redirect_stdout(out):
    code = cli.main(["rules", "list", "--json"])
built = sorted(m for m in ("egglog", "onnxsat.rules.registry", "onnxsat.rules.families.core") if m in sys.modules)
print(json.dumps({"code": code, "rows": json.loads(out.getvalue()), "imported": built}))
"""


def test_rules_list_from_the_cache_imports_no_egglog(tmp_path: Path) -> None:
    in_tree_rows(tmp_path / "onnxsat")  # the listing a first `rules list` writes
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", _LIST_AND_REPORT_IMPORTS], capture_output=True, text=True, env=env, check=True
    )
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["code"] == 0 and result["imported"] == []
    expected = [{**row, "verification": {"status": "not run"}} for row in rows_of(RULES)]
    assert result["rows"] == expected


def test_a_stale_or_damaged_listing_is_rebuilt(tmp_path: Path) -> None:
    path = tmp_path / LISTING_FILE
    path.write_text(json.dumps({"key": "another version", "rows": []}))
    assert in_tree_rows(tmp_path) == rows_of(RULES)
    stored = disk_cache.read(path)
    assert stored is not None and json.loads(stored)["key"] == listing_key()
    path.write_text("{not json")
    assert in_tree_rows(tmp_path) == rows_of(RULES)
