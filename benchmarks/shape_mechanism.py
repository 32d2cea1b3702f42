"""Compare the two ways shapes enter the e-graph at import.

* seeded (the default): fully known shapes from ONNX shape inference are set on every imported
  tensor; the egglog rules compute the symbolic ones and every tensor rewrites create.
* egglog-only: only leaves get shapes; the egglog rules compute everything else, one analysis
  iteration per layer of depth.

Prints import time for each and the share of tensors the egglog rules shape on their own.
Usage: python benchmarks/shape_mechanism.py [extra.onnx ...]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import onnx

from onnxsat.egraph import lang as L
from onnxsat.egraph.importer import from_onnx

LIGHT = Path(os.path.dirname(onnx.__file__)) / "backend" / "test" / "data" / "light"
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _shaped_share(model: onnx.ModelProto) -> tuple[float, float]:
    start = time.perf_counter()
    program = from_onnx(model, trust_onnx_shapes=False)
    seconds = time.perf_counter() - start
    names = [n for n in program.names if n in program.terms]
    shaped = sum(program.egraph.lookup_function_value(L.shape(program.terms[n])) is not None for n in names)
    return seconds, shaped / max(len(names), 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*", type=Path)
    args = parser.parse_args(argv)
    paths = sorted(LIGHT.glob("*.onnx")) + [EXAMPLES / "transformer_block.onnx"] + list(args.models)
    print("| model | nodes | seeded import (s) | egglog-only import (s) | shaped by egglog rules alone |")
    print("|---|---:|---:|---:|---:|")
    for path in paths:
        model = onnx.load(str(path))
        start = time.perf_counter()
        from_onnx(model)
        seeded = time.perf_counter() - start
        alone, share = _shaped_share(model)
        print(f"| {path.stem} | {len(model.graph.node)} | {seeded:.2f} | {alone:.2f} | {share:.1%} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
