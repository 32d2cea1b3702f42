"""How much of a transformer export's onnxruntime time is matrix products: the bound on what a
graph rewrite that keeps the products can win.

For each corpus model (``--corpus``, a full-size export of the manifest): onnxruntime's own
profile (ORT_ENABLE_ALL, one thread unless ``--threads``, the corpus feeds) of the original, its kernel time by op type,
and the products' (MatMul, Gemm, FusedMatMul, Conv; attention ops count as the rest: they are what
fusion replaces) time. If everything else took no time, the model would run ``1 / share`` times
faster: a rewrite that keeps the products (an exact one cannot drop a FLOP the outputs need) stays
under that bound. Two shares bracket it: of the profiled kernel time (profiling adds time of its
own to every kernel, which inflates the many small ones: a 478-node decode step profiled 4.44 ms,
its 108-node optimized form 4.05 ms, and unprofiled the two tie), and of a run timed without
profiling (another session seconds later, onnxruntime's time between kernels included; the host's
speed moves a few percent between the two).

    python benchmarks/gemm_share.py --corpus DIR [--only llama ...] [--calls 10] [--threads 1]
        -> benchmarks/results/gemm_share.md (gemm_share_2threads.md with --threads 2, ...)

With several threads a kernel's time is its wall time, so the products' share is of the time the
model spends in them, each spread over the threads as onnxruntime spreads it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from collections import Counter
from pathlib import Path

import onnxruntime as ort

from onnxsat.latency import block_median

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.realmodels_feeds import feeds_for  # noqa: E402

PRODUCTS = frozenset({"MatMul", "Gemm", "FusedMatMul", "Conv", "FusedConv"})
TRANSFORMERS = ("bert", "gpt2", "llama", "mistral", "qwen2", "t5", "whisper")


def _session(path: Path, threads: int, profile_dir: str | None = None) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if profile_dir is not None:
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(profile_dir) / "p")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def kernel_times(path: Path, feeds: dict, calls: int, threads: int = 1) -> tuple[Counter[str], float]:
    """Mean kernel microseconds per op type over ``calls`` profiled runs after two warm ones, and
    the median microseconds of a run without profiling (which adds time of its own per node:
    on a decode step's 500 nodes, 10%)."""
    with tempfile.TemporaryDirectory(prefix="onnxsat-profile-") as tmp:
        session = _session(path, threads, tmp)
        for _ in range(calls + 2):
            session.run(None, feeds)
        events = json.loads(Path(session.end_profiling()).read_text())
    runs = sorted((e["ts"], e["dur"]) for e in events if e.get("name") == "model_run")
    warm_end = runs[1][0] + runs[1][1]
    kernels: Counter[str] = Counter()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] >= warm_end:
            kernels[e["args"]["op_name"]] += e["dur"] / calls
    plain = _session(path, threads)
    return kernels, 1e6 * block_median(lambda: plain.run(None, feeds), calls, untimed=1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--only", action="append", default=[])
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1, help="onnxruntime intra-op threads")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    suffix = "" if args.threads == 1 else f"_{args.threads}threads"
    out = args.out or ROOT / "benchmarks" / "results" / f"gemm_share{suffix}.md"
    index = json.loads((args.corpus / "INDEX.json").read_text())
    names = [n for n in index if "error" not in index[n] and any(t in n for t in args.only or TRANSFORMERS)]
    rows, bounds = [], []
    for name in names:
        record = index[name]
        feeds = feeds_for(record["inputs"], record["seed"])
        kernels, run_us = kernel_times(args.corpus / record["file"], feeds, args.calls, args.threads)
        products = sum(t for op, t in kernels.items() if op in PRODUCTS)
        of_kernels, of_run = products / sum(kernels.values()), products / run_us
        bounds.append((1 / of_kernels, 1 / of_run))
        rest = ", ".join(f"{op} {t / 1e3:.2f}" for op, t in kernels.most_common() if op not in PRODUCTS)
        rows.append(
            f"| {name} | {run_us / 1e3:.2f} | {of_kernels:.1%} | x{1 / of_kernels:.3f} | {of_run:.1%} | x{1 / of_run:.3f} | {rest[:120]} |"
        )
        print(rows[-1], file=sys.stderr, flush=True)
    geomeans = [math.exp(sum(math.log(b[i]) for b in bounds) / len(bounds)) for i in (0, 1)]
    lines = [
        "# Matrix products' share of onnxruntime's time on the transformer exports",
        "",
        f"`python benchmarks/gemm_share.py --corpus DIR --threads {args.threads}` (ORT_ENABLE_ALL,"
        f" {args.threads} onnxruntime thread(s), {args.calls} profiled and"
        f" {args.calls} unprofiled runs per model, load {os.getloadavg()[0]:.1f} at the end). Bound: the speedup"
        " if everything but the products took no time (what no exact rewrite that keeps the products can pass),"
        " from the products' share of the profiled kernel time and of an unprofiled run.",
        "",
        "| model | run, unprofiled (ms) | products / kernel time | bound | products / run | bound | other kernels (ms per run, largest first) |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"Geometric means of the bounds over {len(bounds)} models: **x{geomeans[0]:.3f}** from the kernel time,"
        f" **x{geomeans[1]:.3f}** from the run.",
        "",
    ]
    out.write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
