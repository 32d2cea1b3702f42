"""Attention and rotary fusion on the committed transformer exports: nodes and onnxruntime latency.

For each model of tests/data/realmodels given: the original, onnxsat's result without the attention
family (``--disable-rules`` of its rules) and with it (the default). Latency on onnxruntime's CPU
provider (ORT_ENABLE_ALL, one thread) in interleaved rounds with bootstrap 95% intervals
(``onnxsat.latency.compare_models``): original / optimized, and without / with the attention
family. Ratios only: the machine may be shared (the load average is printed).

    python benchmarks/attention_fusion.py [--models qwen2-dynamo-static ...] [--rounds 30]
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
    args = parser.parse_args()
    index = json.loads((DATA / "INDEX.json").read_text())
    off = list(RULES.families["attention"])
    print(f"load average {os.getloadavg()}")
    for name in args.models:
        record = index[name]
        original = onnx.load(DATA / record["file"])
        without, _ = onnxsat.optimize(original, Options(disable_rules=tuple(off)))
        optimized, report = onnxsat.optimize(original, Options())
        feeds = feeds_for(record["inputs"], seed=0)
        print(f"{name}: nodes {len(original.graph.node)} -> {len(without.graph.node)} (no attention rules) -> "
              f"{len(optimized.graph.node)}; {_fused(optimized)}; verification {report.verification.status}")  # fmt: skip
        for label, base in (("original / optimized", original), ("without / with attention rules", without)):
            result = compare_models(base, optimized, feeds, level="all", threads=1, rounds=args.rounds)
            print(f"  {label}: {result}")
        print(f"  load average {os.getloadavg()}", flush=True)


if __name__ == "__main__":
    main()
