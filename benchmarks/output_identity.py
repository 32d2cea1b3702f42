"""Fingerprints of the default optimized output of every example and ONNX light model.

A restructuring that must not change behaviour is checked by running this before and after and
comparing the two JSON files: the sha256 of each written model's bytes, its node count and the
estimated cost before/after. Models are optimized with default ``Options`` in one process, in a
fixed order, with iteration and e-node budgets only (no time budget can cut a run short on a
loaded machine).

    python benchmarks/output_identity.py --out /tmp/before.json
    python benchmarks/output_identity.py --out /tmp/after.json --compare /tmp/before.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def models() -> list[Path]:
    """examples/*.onnx, then the light models shipped inside the onnx package."""
    import onnx

    light = Path(os.path.dirname(onnx.__file__)) / "backend" / "test" / "data" / "light"
    return sorted((ROOT / "examples").glob("*.onnx")) + sorted(light.glob("*.onnx"))


def fingerprint(path: Path, cache_dir: str | None = None) -> dict:
    """Optimize ``path`` with default options (no time budget) and describe the written bytes."""
    import onnx

    import onnxsat
    from onnxsat.base.errors import OnnxsatError, one_line

    model = onnx.load(str(path))
    options = onnxsat.Options(budgets=onnxsat.Budgets(seconds=1e9), plugin_cache_dir=cache_dir)
    try:
        optimized, report = onnxsat.optimize(model, options)
    except OnnxsatError as error:
        return {"status": f"error: {one_line(error)}"}
    data = optimized.SerializeToString(deterministic=True)
    summary = json.loads(report.to_json())
    return {
        "status": "ok",
        "sha256": hashlib.sha256(data).hexdigest(),
        "nodes_after": len(optimized.graph.node),
        "cost": {k: summary.get(k) for k in ("cost_before", "cost_after") if k in summary},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--compare", help="an earlier output of this script; exit 1 on any difference")
    parser.add_argument("--cache-dir", help="Options.plugin_cache_dir: the built rules are read from (or stored in) it")
    args = parser.parse_args(argv)
    results = {path.name: fingerprint(path, args.cache_dir) for path in models()}
    Path(args.out).write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    if not args.compare:
        return 0
    before = json.loads(Path(args.compare).read_text())
    differ = sorted(name for name in before.keys() | results.keys() if before.get(name) != results.get(name))
    for name in differ:
        print(f"differs: {name}: {before.get(name)} -> {results.get(name)}")
    print(f"{len(results) - len(differ)} of {len(results)} identical")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
