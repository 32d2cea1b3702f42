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


def run(name: str, model: onnx.ModelProto, mode: str, size: int, verify: bool) -> dict[str, object]:
    """One optimize run in ``mode`` (whole or regions) and what it gave."""
    options = Options(verify=verify, region_nodes=1 if mode == "regions" else 0, region_size=size)
    load = os.getloadavg()[0]
    start = time.perf_counter()
    optimized, report = optimize(model, options)
    seconds = time.perf_counter() - start
    with Session(model, Options()) as session:
        priced_before, priced_after = price(session, model), price(session, optimized)
    regions = report.regions
    stages = report.stage_seconds
    return {
        "model": name,
        "mode": mode,
        "nodes_before": len(model.graph.node),
        "nodes_after": len(optimized.graph.node),
        "priced_before": round(priced_before, 1),
        "priced_after": round(priced_after, 1),
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
    parser.add_argument("--region-size", type=int, default=Options().region_size)
    parser.add_argument("--modes", default="whole,regions", help="comma-separated: whole, regions")
    parser.add_argument("--no-verify", action="store_true")
    args = parser.parse_args()
    modes = args.modes.split(",")
    for k, path in enumerate(args.models):
        model = onnx.load(str(path))
        for mode in modes if k % 2 == 0 else modes[::-1]:
            print(json.dumps(run(path.stem, model, mode, args.region_size, not args.no_verify)), flush=True)


if __name__ == "__main__":
    main()
