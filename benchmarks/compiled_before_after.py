"""Two versions of onnxsat compared on the compiled corpus models, each against onnxruntime.

Two code versions cannot share one process, so each model runs in turn in a process of each
version (``--before`` and ``--after``: the Python interpreters of two installs, e.g. a venv with an
older checkout installed), alternating ``--repeats`` times; each process times its compiled model
against onnxruntime ORT_ENABLE_ALL in the same process (``onnxsat.latency.compare_latency``, 20
interleaved rounds, each runtime settled before its block), so a ratio carries the machine's state
with it and the two versions' ratios compare. Prints a Markdown table (mean ratio per version and
after / before) and the geometric means.

    python benchmarks/compiled_before_after.py --before /tmp/oldvenv/bin/python \\
        --after .venv/bin/python --corpus /work/realmodels-full resnet18-ts-static ...
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = """
import json, sys
import numpy as np, onnx, onnxsat
from onnxsat.kernels.compile_options import CompileOptions
from onnxsat.latency import compare_latency, ort_session
sys.path.insert(0, {tests!r})
from realmodels_feeds import feeds_for
entry = json.load(open({index!r}))[{name!r}]
model = onnx.load({path!r})
feeds = feeds_for(entry["inputs"], entry["seed"])
compiled = onnxsat.compile(model, compile_options=CompileOptions(threads={threads}))
session = ort_session(model, threads={threads})
c = compare_latency(lambda: session.run(None, feeds), lambda: compiled(feeds), rounds=20, calls_per_round=5, settle_s=0.2)
print("RATIO", c.ratio)
"""


def ratio(python: str, corpus: Path, name: str, threads: int) -> float:
    """ORT time / compiled time for ``name`` in a fresh process of ``python``."""
    code = CHILD.format(
        tests=str(Path(__file__).resolve().parent.parent / "tests"),
        index=str(corpus / "INDEX.json"),
        name=name,
        path=str(corpus / f"{name}.onnx"),
        threads=threads,
    )
    # run outside any checkout: ``python -c`` imports from the working directory first
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True, cwd=tempfile.gettempdir()).stdout
    return float(next(line.split()[1] for line in out.splitlines() if line.startswith("RATIO")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=True, help="Python of the older install")
    parser.add_argument("--after", default=sys.executable, help="Python of the newer install")
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("models", nargs="+")
    args = parser.parse_args()
    rows = {}
    for name in args.models:
        before, after = [], []
        for _ in range(args.repeats):
            before.append(ratio(args.before, args.corpus, name, args.threads))
            after.append(ratio(args.after, args.corpus, name, args.threads))
        rows[name] = (sum(before) / len(before), sum(after) / len(after))
        print(json.dumps({"model": name, "before": before, "after": after}), file=sys.stderr, flush=True)
    print("| model | ORT / compiled, before | after | after / before |\n|---|---|---|---|")
    for name, (b, a) in rows.items():
        print(f"| {name} | x{b:.3f} | x{a:.3f} | x{a / b:.3f} |")

    def geomean(values: list[float]) -> float:
        return math.exp(sum(math.log(v) for v in values) / len(values))

    print(f"\nGeometric means: before x{geomean([b for b, _ in rows.values()]):.3f}, after x{geomean([a for _, a in rows.values()]):.3f}.")


if __name__ == "__main__":
    main()
