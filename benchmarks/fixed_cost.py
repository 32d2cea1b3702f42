"""Fixed cost of onnxsat: what a user pays before any model-specific work, each in a fresh process.

Rows: importing onnx, onnxruntime and egglog alone (the floor nobody can go below);
``onnxsat rules list`` (its listing cache warmed by an untimed first call); ``onnxsat optimize
examples/small_cnn.onnx`` with verification; and, in one process, the first and second optimize
of small_cnn (no verification), whose difference is what a per-process cost (rule building and
declaration) adds to the first model. ``--against PYTHON`` runs every row also with another
interpreter command (e.g. a wrapper running an older checkout), interleaved, so the two columns
are measured side by side under the same load. Times are medians of ``--repeat`` runs; the load
average before and after is printed with them.

    python benchmarks/fixed_cost.py --repeat 3
    python benchmarks/fixed_cost.py --against /path/to/old-python-wrapper
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SMALL_CNN = ROOT / "examples" / "small_cnn.onnx"

_IN_PROCESS = f"""
import json, time
import onnx, onnxsat
model = onnx.load({str(SMALL_CNN)!r})
options = onnxsat.Options(verify=False)
times = []
for _ in range(2):
    start = time.perf_counter()
    onnxsat.optimize(model, options)
    times.append(time.perf_counter() - start)
print(json.dumps(times))
"""


def _wall(cmd: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, env=env, cwd=ROOT)
    return time.perf_counter() - start


def measure(python: list[str], env: dict[str, str], out: Path) -> dict[str, float]:
    """One sample of every row for the interpreter command ``python``."""
    first, second = json.loads(
        subprocess.run([*python, "-c", _IN_PROCESS], check=True, capture_output=True, text=True, env=env, cwd=ROOT)
        .stdout.splitlines()[-1]
    )
    return {
        "import onnx+onnxruntime+egglog": _wall([*python, "-c", "import onnx, onnxruntime, egglog"], env),
        "rules list": _wall([*python, "-m", "onnxsat", "rules", "list"], env),
        "optimize small_cnn (verified)": _wall(
            [*python, "-m", "onnxsat", "optimize", str(SMALL_CNN), "-o", str(out), "--quiet"], env
        ),
        "first model in process": first,
        "second model in process": second,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--against", help="another interpreter command, measured interleaved with this one")
    args = parser.parse_args(argv)
    pythons = {"this": [sys.executable]}
    if args.against:
        pythons["against"] = args.against.split()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "XDG_CACHE_HOME": tmp}
        out = Path(tmp) / "out.onnx"
        for python in pythons.values():  # warm the rule listing and the plugin verdict caches, untimed
            subprocess.run([*python, "-m", "onnxsat", "rules", "list"], check=True, capture_output=True, env=env)
        samples: dict[str, list[dict[str, float]]] = {label: [] for label in pythons}
        for _ in range(args.repeat):
            for label, python in pythons.items():
                samples[label].append(measure(python, env, out))
    load_after = os.getloadavg()
    rows = list(samples["this"][0])
    medians = {label: {row: statistics.median(s[row] for s in runs) for row in rows} for label, runs in samples.items()}
    header = f"{'row':<34}" + "".join(f"{label:>12}" for label in pythons)
    print(header + ("   this/against" if args.against else ""))
    for row in rows:
        line = f"{row:<34}" + "".join(f"{medians[label][row]:>11.2f}s" for label in pythons)
        if args.against:
            line += f"   {medians['this'][row] / medians['against'][row]:>8.2f}"
        print(line)
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f}; medians of {args.repeat}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
