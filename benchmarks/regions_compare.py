"""Region-wise against whole-graph saturation on the same models, measured side by side.

For each model (ONNX files on the command line) the two modes run one after the other in this
process, alternating which goes first per model so load drift hits both alike: ``optimize`` with
``region_nodes=0`` (whole graph) and with ``region_nodes=1`` (every graph by regions, of
``--region-size`` nodes). Each row gives nodes before/after, both results priced on one scale
(``onnxsat.by_regions.price``: imported and extracted as they stand, so the region-wise run's own
region-summed costs do not enter), wall time with and without verification, regions, how many were
replayed, windows, and the load average before and after. A JSON line per run on stdout.

    python benchmarks/regions_compare.py tests/data/realmodels/llama-ts-static.onnx --region-size 80
    python benchmarks/regions_compare.py big/llama-64-layers.onnx --modes regions   # whole too slow
    python benchmarks/regions_compare.py corpus/*.onnx --region-size 200,80 --no-verify --no-price
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import onnx

from onnxsat.base.options import Options
from onnxsat.by_regions import price
from onnxsat.pipeline import Session, optimize


def run(name: str, model: onnx.ModelProto, mode: str, size: int, verify: bool, priced: bool = True) -> dict[str, object]:
    """One optimize run in ``mode`` (whole or regions) and what it gave (``priced``: both programs
    priced on one scale, ~25 s a model on a transformer)."""
    options = Options(verify=verify, region_nodes=1 if mode == "regions" else 0, region_size=size)
    load = os.getloadavg()[0]
    start = time.perf_counter()
    optimized, report = optimize(model, options)
    seconds = time.perf_counter() - start
    priced_before = priced_after = None
    if priced:
        with Session(model, Options()) as session:
            priced_before, priced_after = price(session, model), price(session, optimized)
    regions = report.regions
    stages = report.stage_seconds
    return {
        "model": name,
        "mode": mode,
        "region_size": size if mode == "regions" else None,
        "nodes_before": len(model.graph.node),
        "nodes_after": len(optimized.graph.node),
        "priced_before": None if priced_before is None else round(priced_before, 1),
        "priced_after": None if priced_after is None else round(priced_after, 1),
        "seconds": round(seconds, 2),
        "seconds_without_verification": round(seconds - stages.get("reference", 0.0) - stages.get("verify", 0.0), 2),
        "verification": report.verification.status,
        "kept_original": bool(report.kept_original),
        "regions": regions.regions if regions else None,
        "saturated": regions.distinct if regions else None,
        "replayed": regions.replayed if regions else None,
        "windows": regions.windows if regions else None,
        "windows_replayed": regions.windows_replayed if regions else None,
        "merged_by_cse": regions.merged_by_cse if regions else None,
        "stages": {k: v for k, v in stages.items() if v >= 0.1},
        "load_before": round(load, 2),
        "load_after": round(os.getloadavg()[0], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", type=Path)
    parser.add_argument(
        "--region-size", default=str(Options().region_size), help="target region size; comma-separated for several runs"
    )
    parser.add_argument("--modes", default="whole,regions", help="comma-separated: whole, regions")
    parser.add_argument("--no-verify", action="store_true")
    parser.add_argument("--no-price", action="store_true", help="node counts only (skip pricing both on one scale)")
    args = parser.parse_args()
    runs = [(mode, int(size)) for mode in args.modes.split(",") for size in args.region_size.split(",")]
    runs = list(dict.fromkeys((mode, size if mode == "regions" else 0) for mode, size in runs))
    for k, path in enumerate(args.models):
        model = onnx.load(str(path))
        for mode, size in runs if k % 2 == 0 else runs[::-1]:
            record = run(path.stem, model, mode, size, not args.no_verify, not args.no_price)
            print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
