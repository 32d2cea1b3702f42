"""Attention and rotary fusion on the transformer exports: nodes and onnxruntime latency.

For each model given (of tests/data/realmodels, or with ``--corpus`` of a full-size export of the
manifest): the original, onnxsat's result without the attention family (``--disable-rules`` of its
rules) and with it (the default). Latency on onnxruntime's CPU provider (ORT_ENABLE_ALL, one
thread) in interleaved rounds with bootstrap 95% intervals: original / optimized, and without /
with the attention family. The committed small exports are timed in this process
(``onnxsat.latency.compare_models``); the full-size ones in processes of their own, renewed every
few rounds, as ``realmodels.py`` times them (``compare_peers.time_interleaved``: where onnxruntime
lays a large session out in memory moves its time by 5-10% within one process). Ratios only: the
machine may be shared (the load average is printed).

    python benchmarks/attention_fusion.py [--models qwen2-dynamo-static ...] [--rounds 30] [--corpus DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from pathlib import Path

import onnx

import onnxsat
from onnxsat import Options
from onnxsat.latency import compare_models
from onnxsat.rules import RULES

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from tests.realmodels_feeds import feeds_for  # noqa: E402

DATA = ROOT / "tests" / "data" / "realmodels"
DEFAULT = ["qwen2-dynamo-static", "qwen2-decode-dynamo-static", "llama-decode-dynamo-dynamic", "llama-ts-static"]


def _fused(model: onnx.ModelProto) -> str:
    ops = Counter(n.op_type for n in model.graph.node)
    return f"Attention {ops['Attention']}, RotaryEmbedding {ops['RotaryEmbedding']}, Softmax {ops['Softmax']}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=DEFAULT)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--corpus", type=Path, help="a full-size export (INDEX.json) instead of tests/data/realmodels")
    args = parser.parse_args()
    data = args.corpus or DATA
    index = json.loads((data / "INDEX.json").read_text())
    off = list(RULES.families["attention"])
    print(f"load average {os.getloadavg()}")
    for name in args.models:
        record = index[name]
        original = onnx.load(data / record["file"])
        without, _ = onnxsat.optimize(original, Options(disable_rules=tuple(off)))
        optimized, report = onnxsat.optimize(original, Options())
        feeds = feeds_for(record["inputs"], seed=record.get("seed", 0) if args.corpus else 0)
        print(f"{name}: nodes {len(original.graph.node)} -> {len(without.graph.node)} (no attention rules) -> "
              f"{len(optimized.graph.node)}; {_fused(optimized)}; verification {report.verification.status}")  # fmt: skip
        if args.corpus:
            _separate_processes(original, without, optimized, feeds, args.rounds)
        else:
            for label, base in (("original / optimized", original), ("without / with attention rules", without)):
                result = compare_models(base, optimized, feeds, level="all", threads=1, rounds=args.rounds)
                print(f"  {label}: {result}")
        print(f"  load average {os.getloadavg()}", flush=True)


def _separate_processes(original: onnx.ModelProto, without: onnx.ModelProto, optimized: onnx.ModelProto, feeds: dict, rounds: int) -> None:
    """The three models timed as ``realmodels.py`` times them; ratios against the original."""
    import numpy as np
    from compare_peers import time_interleaved

    from onnxsat.latency import bootstrap_ratio_ci

    times = time_interleaved([original, without, optimized], feeds, "all", rounds, 1)
    for label, row in (("original / without attention rules", times[1]), ("original / optimized", times[2])):
        low, high = bootstrap_ratio_ci(times[0], row)
        print(f"  {label}: x{np.median(times[0]) / np.median(row):.3f} [{low:.3f}, {high:.3f}]")
    low, high = bootstrap_ratio_ci(times[1], times[2])
    print(f"  without / with attention rules: x{np.median(times[1]) / np.median(times[2]):.3f} [{low:.3f}, {high:.3f}]")


if __name__ == "__main__":
    main()
