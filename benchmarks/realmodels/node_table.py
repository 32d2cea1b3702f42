"""Node counts of the corpus before and after onnxsat, onnxslim and onnx-simplifier.

    python benchmarks/realmodels/node_table.py --corpus /work/realmodels-full \\
        --peers-python /work/venv-export/bin/python --out benchmarks/results/realmodels_nodes.md

Each tool runs as its own process with a timeout on every exported model of the corpus index
(export.py's INDEX.json); the table gives each one's node count, or its exit code / "timeout". The
onnxsat column is `onnxsat optimize` with its defaults (verification on) from this checkout.
Latency: benchmarks/realmodels.py.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import onnx

TOOLS = ("onnxsat", "onnxslim", "onnxsim")


def _command(tool: str, src: Path, dst: Path, peers_python: str) -> list[str]:
    if tool == "onnxsat":
        return [sys.executable, "-m", "onnxsat", "optimize", str(src), "-o", str(dst), "--quiet"]
    if tool == "onnxslim":
        return [peers_python, "-m", "onnxslim", str(src), str(dst)]
    return [peers_python, "-m", "onnxsim", str(src), str(dst)]


def run_tool(tool: str, src: Path, peers_python: str, timeout: float) -> dict:
    """One tool on one model: {"nodes", "seconds"} or {"exit"/"timeout", "seconds", "message"}."""
    with tempfile.TemporaryDirectory() as tmp:
        dst = Path(tmp) / "out.onnx"
        start = time.perf_counter()
        try:
            done = subprocess.run(
                _command(tool, src, dst, peers_python),
                capture_output=True,
                text=True,
                timeout=timeout,
                env={**os.environ, "OMP_NUM_THREADS": "1"},
            )
        except subprocess.TimeoutExpired:
            return {"timeout": timeout, "seconds": round(time.perf_counter() - start, 1)}
        seconds = round(time.perf_counter() - start, 1)
        if done.returncode != 0 or not dst.exists():
            lines = [ln for ln in (done.stderr or done.stdout).splitlines() if ln.strip()]
            return {"exit": done.returncode, "seconds": seconds, "message": lines[-1][:300] if lines else ""}
        return {"nodes": len(onnx.load(dst, load_external_data=False).graph.node), "seconds": seconds}


def _cell(result: dict) -> str:
    if "nodes" in result:
        return f"{result['nodes']:,}"
    if "timeout" in result:
        return f"timeout {result['timeout']:.0f} s"
    return f"exit {result['exit']}"


def write_table(index: dict, results: dict, out: Path, header: str) -> None:
    rows = [
        "| model | kind | exporter | shapes | nodes | onnxsat | onnxslim | onnx-simplifier |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, record in sorted(index.items()):
        if "error" in record:
            rows.append(
                f"| {name} | | {record['exporter']} | {record['shapes']} | export failed: {record['error'][:120]} | | | |"
            )
            continue
        cells = [_cell(results[name][t]) if t in results.get(name, {}) else "" for t in TOOLS]
        rows.append(
            f"| {name} | {record['kind']} | {record['exporter']} | {record['shapes']} | {record['nodes']:,} | "
            + " | ".join(cells)
            + " |"
        )
    notes = []
    for name in sorted(results):
        for tool in TOOLS:
            result = results[name].get(tool, {})
            if "exit" in result:
                notes.append(
                    f"- {name}, {tool}: exit {result['exit']} after {result['seconds']} s: `{result['message']}`"
                )
            elif "timeout" in result:
                notes.append(f"- {name}, {tool}: stopped after {result['timeout']:.0f} s")
    out.write_text(
        header + "\n".join(rows) + "\n\n" + ("Failures:\n\n" + "\n".join(notes) + "\n" if notes else "")
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--corpus", type=Path, required=True, help="directory with INDEX.json and the exports"
    )
    parser.add_argument("--peers-python", required=True, help="python that has onnxslim and onnxsim")
    parser.add_argument("--out", type=Path, required=True, help="markdown table to write")
    parser.add_argument("--results", type=Path, help="JSON of raw results, kept between runs (resume)")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--only", action="append", help="only this model (repeatable)")
    parser.add_argument("--tools", default=",".join(TOOLS))
    parser.add_argument("--header", default="# Real-model corpus: node counts\n\n")
    args = parser.parse_args(argv)
    index = json.loads((args.corpus / "INDEX.json").read_text())
    results_path = args.results or args.out.with_suffix(".json")
    results: dict = json.loads(results_path.read_text()) if results_path.exists() else {}
    for name, record in sorted(index.items()):
        if "error" in record or (args.only and name not in args.only):
            continue
        for tool in args.tools.split(","):
            if tool in results.get(name, {}):
                continue
            result = run_tool(tool, args.corpus / record["file"], args.peers_python, args.timeout)
            results.setdefault(name, {})[tool] = result
            print(f"{name} {tool}: {result}", flush=True)
            results_path.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
            write_table(index, results, args.out, args.header)
    write_table(index, results, args.out, args.header)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
