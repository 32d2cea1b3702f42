"""Fixed cost of onnxsat: what a user pays before any model-specific work, each in a fresh process.

Rows: importing onnx, onnxruntime and egglog alone (the floor nobody can go below);
``onnxsat rules list`` (its listing cache warmed by an untimed first call); ``onnxsat optimize
examples/small_cnn.onnx`` with verification; and, in one process, the first and second optimize
of small_cnn (no verification), whose difference is what a per-process cost (rule building and
declaration) adds to the first model. ``--against PYTHON`` runs every row also with another
interpreter command (e.g. a wrapper that changes into an older checkout and runs its venv's
python there; each interpreter gets its own cache directory), interleaved, so the two columns
are measured side by side under the same load. Times are medians of ``--repeat`` runs; the load
average before and after is printed with them. ``--markdown FILE`` also writes the table, every
sample in the order it was taken and the load average at each, for ``benchmarks/results``.
The CPU rows are the user + system seconds of the import and optimize processes (``os.wait4``),
and their difference. The last rows say how many egglog rules exist and are selected for small_cnn.

    python benchmarks/fixed_cost.py --repeat 3
    python benchmarks/fixed_cost.py --against /path/to/old-python-wrapper --markdown out.md
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


_DECLARED = f"""
import json, onnx, onnxsat
from onnxsat.rules.registry import RuleTable
from onnxsat.rules.schedule import select_rules
table, enabled = RuleTable.default(), select_rules()
rewrites = sum(len(table.egg_rules[n]) for n in enabled)
try:
    from onnxsat.egraph.importer import import_symbols
    from onnxsat.egraph.shapes import analysis_rules
    from onnxsat.rules.schedule import select
    chosen = select(enabled, table, import_symbols(onnx.load({str(SMALL_CNN)!r})))
    declared = [len(chosen.analysis.__egg_ruleset__.rules), len(chosen.rewrites)]
    every = [len(analysis_rules()), rewrites]
except ImportError:  # a checkout that declares every rule
    from onnxsat.egraph.shapes import shape_rules
    every = declared = [len(shape_rules.__egg_ruleset__.rules), rewrites]
try:  # a checkout that declares a rule once its tables hold rows
    from onnxsat.egraph.live import built_rules
    onnxsat.optimize(onnx.load({str(SMALL_CNN)!r}), onnxsat.Options(verify=False))
    run = built_rules()
except ImportError:
    run = sum(declared)
print(json.dumps(declared + every + [run]))
"""


def declared_rules(python: list[str], env: dict[str, str]) -> dict[str, int]:
    """How many analysis and rewrite rules a run declares for small_cnn, and how many are enabled."""
    out = subprocess.run([*python, "-c", _DECLARED], check=True, capture_output=True, text=True, env=env, cwd=ROOT)
    analysis, rewrites, all_analysis, all_rewrites, run = json.loads(out.stdout.splitlines()[-1])
    return {
        "egglog rules the run declares": run,
        "analysis rules selected": analysis,
        "rewrite rules selected": rewrites,
        "analysis rules in all": all_analysis,
        "rewrite rules enabled": all_rewrites,
    }


def _wall(cmd: list[str], env: dict[str, str]) -> float:
    return _timed(cmd, env)[0]


def _timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system, every thread, from ``os.wait4``) of one fresh
    process: on a shared, loaded machine the CPU seconds move far less than the wall."""
    start = time.perf_counter()
    child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=ROOT)
    assert child.stderr is not None
    err = child.stderr.read()
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - start
    if child.returncode != 0:
        raise subprocess.CalledProcessError(child.returncode, cmd, stderr=err)
    return wall, usage.ru_utime + usage.ru_stime


def measure(python: list[str], env: dict[str, str], out: Path) -> dict[str, float]:
    """One sample of every row for the interpreter command ``python``."""
    first, second = json.loads(
        subprocess.run([*python, "-c", _IN_PROCESS], check=True, capture_output=True, text=True, env=env, cwd=ROOT)
        .stdout.splitlines()[-1]
    )
    imports = _timed([*python, "-c", "import onnx, onnxruntime, egglog"], env)
    optimized = _timed([*python, "-m", "onnxsat", "optimize", str(SMALL_CNN), "-o", str(out), "--quiet"], env)
    return {
        "import onnx+onnxruntime+egglog": imports[0],
        "rules list": _wall([*python, "-m", "onnxsat", "rules", "list"], env),
        "optimize small_cnn (verified)": optimized[0],
        "first model in process": first,
        "second model in process": second,
        "CPU s: import onnx+onnxruntime+egglog": imports[1],
        "CPU s: optimize small_cnn (verified)": optimized[1],
        "CPU s: optimize above the imports": optimized[1] - imports[1],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--against", help="another interpreter command, measured interleaved with this one")
    parser.add_argument("--markdown", type=Path, help="also write the results as a markdown file")
    args = parser.parse_args(argv)
    pythons = {"this": [sys.executable]}
    if args.against:
        pythons["against"] = args.against.split()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        # one cache directory per interpreter: two checkouts' rule caches have different keys
        envs = {label: {**os.environ, "XDG_CACHE_HOME": str(Path(tmp) / label)} for label in pythons}
        out = Path(tmp) / "out.onnx"
        for label, python in pythons.items():  # warm the rule table, listing and plugin caches, untimed
            subprocess.run([*python, "-m", "onnxsat", "rules", "list"], check=True, capture_output=True, env=envs[label])
            subprocess.run(
                [*python, "-m", "onnxsat", "optimize", str(SMALL_CNN), "-o", str(out), "--quiet"],
                check=True,
                capture_output=True,
                env=envs[label],
            )
        samples: dict[str, list[dict[str, float]]] = {label: [] for label in pythons}
        loads: list[float] = []
        for _ in range(args.repeat):
            for label, python in pythons.items():
                loads.append(os.getloadavg()[0])
                samples[label].append(measure(python, envs[label], out))
        counts = {label: declared_rules(python, envs[label]) for label, python in pythons.items()}
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
    for row in counts["this"]:
        print(f"{row:<34}" + "".join(f"{counts[label][row]:>12}" for label in pythons))
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f}; medians of {args.repeat}")
    if args.markdown:
        args.markdown.write_text(_markdown(pythons, rows, medians, samples, loads, counts, load_before, load_after))
    return 0


def _markdown(
    pythons: dict[str, list[str]],
    rows: list[str],
    medians: dict[str, dict[str, float]],
    samples: dict[str, list[dict[str, float]]],
    loads: list[float],
    counts: dict[str, dict[str, int]],
    load_before: tuple[float, float, float],
    load_after: tuple[float, float, float],
) -> str:
    labels = list(pythons)
    ratio = len(labels) == 2
    lines = [
        "| row | " + " | ".join(f"{label} (s)" for label in labels) + (" | this/against |" if ratio else " |"),
        "|---|" + "---|" * (len(labels) + ratio),
    ]
    for row in rows:
        cells = [f"{medians[label][row]:.2f}" for label in labels]
        if ratio:
            cells.append(f"{medians['this'][row] / medians['against'][row]:.2f}")
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    for row in counts["this"]:
        lines.append(f"| {row} | " + " | ".join(str(counts[label][row]) for label in labels) + (" | |" if ratio else " |"))
    lines += ["", f"Medians of {len(samples['this'])} interleaved runs; load average (1 min) {load_before[0]:.2f} "
              f"before, {load_after[0]:.2f} after.", "", "Every sample, in the order taken (load average when it began):", ""]
    lines += ["| # | interpreter | load | " + " | ".join(rows) + " |", "|---|---|---|" + "---|" * len(rows)]
    position = 0
    for i in range(len(samples["this"])):
        for label in labels:
            values = " | ".join(f"{samples[label][i][row]:.2f}" for row in rows)
            lines.append(f"| {i + 1} | {label} | {loads[position]:.2f} | {values} |")
            position += 1
    lines += ["", "Interpreters: " + "; ".join(f"{label}: `{' '.join(cmd)}`" for label, cmd in pythons.items()), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
