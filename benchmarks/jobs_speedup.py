"""The speed-up of ``onnxsat optimize --jobs 2`` over ``--jobs 1`` on a 24-layer Llama-style decoder.

The decoder (transformers ``LlamaForCausalLM``: hidden 256, 4 heads, FFN 688, random weights,
batch 1, sequence 128 static, TorchScript export at opset 17 through
``benchmarks/realmodels/export.py``) is exported once with /work/venv-export's torch
(``--python-export``) into ``--workdir`` and reused. ``--vary-ffn`` gives every layer its own FFN
width (688 + 16 k), so the layers differ without turning replay off.

Each round runs ``onnxsat optimize MODEL OUT --region-nodes 1 --region-size S --no-region-replay
--jobs J`` as a fresh process (the CLI, so end-to-end time is what a user waits: imports, rule
table from the disk cache, verification included unless ``--no-verify``), the two settings
interleaved and their order alternated per round, and reads the report's stage times: the
saturation stage is ``regions-saturate + regions-windows`` (every region and window saturated,
extracted and exported). Every round's output must be byte-identical to the first's (same output:
the floors are meaningless otherwise). The result table goes to
``benchmarks/results/scale_out_jobs.md`` with the load average before and after each run: on a
loaded machine only the interleaved ratios count.

    python benchmarks/jobs_speedup.py --rounds 3              # the floors' run
    python benchmarks/jobs_speedup.py --layers 8 --rounds 1   # a quick look

Floors (issue: scale out): >= 1.6x on the saturation stage and >= 1.3x end to end on 2 cores.
``benchmarks/scale_out.py jobs ...`` dispatches here (``main(argv)``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "scale_out_jobs.md"
EXPORT_PYTHON = "/work/venv-export/bin/python"
HIDDEN, HEADS, FFN, VOCAB, SEQUENCE = 256, 4, 688, 32000, 128
SCALING = "\n## Region-wise scaling"
"""The results file's section written by hand (depth scaling), kept when the tables are rewritten."""


def export_decoder(path: Path, layers: int, vary_ffn: bool) -> None:
    """(Run with torch.) The decoder exported to ``path`` with ``benchmarks/realmodels/export.py``'s helpers."""
    sys.path.insert(0, str(ROOT / "benchmarks" / "realmodels"))
    sys.path.insert(0, str(ROOT))
    import export as corpus  # type: ignore[import-not-found]
    import torch

    manifest = corpus.load_manifest()
    arch = json.loads(json.dumps(manifest["architectures"]["llama"]))
    arch["config"]["bench"] = {
        "hidden_size": HIDDEN,
        "num_hidden_layers": layers,
        "num_attention_heads": HEADS,
        "num_key_value_heads": HEADS,
        "intermediate_size": FFN,
        "vocab_size": VOCAB,
        "max_position_embeddings": 2048,
    }
    entry = {"name": "llama-bench", "shapes": "static", "step": "forward", "seed": 0}
    defaults = dict(manifest["defaults"], batch=1, sequence=SEQUENCE)
    torch.manual_seed(0)
    module, args, specs, outputs, axes = corpus.wrap(entry, arch, "bench", defaults)
    if vary_ffn:
        from transformers.models.llama.modeling_llama import LlamaMLP

        inner = module.model
        for k, layer in enumerate(inner.model.layers):
            config = type(inner.config)(**{**inner.config.to_dict(), "intermediate_size": FFN + 16 * k})
            layer.mlp = LlamaMLP(config).eval()
    corpus.export_torch(
        module,
        args,
        path,
        "torchscript",
        [s["name"] for s in specs],
        outputs,
        axes,
        manifest["defaults"]["opset_torchscript"],
    )


def _model(args: argparse.Namespace) -> Path:
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    name = f"llama-{args.layers}-layers{'-ffn-varied' if args.vary_ffn else ''}.onnx"
    path = work / name
    if not path.exists():
        command = [args.python_export, __file__, "--export-only", str(path), "--layers", str(args.layers)]
        command += ["--vary-ffn"] if args.vary_ffn else []
        print("exporting:", " ".join(command), file=sys.stderr, flush=True)
        subprocess.run(command, check=True)
    return path


def _run(model: Path, out: Path, jobs: int, args: argparse.Namespace) -> dict[str, Any]:
    """One CLI run: wall time, the report's stage times, the output's sha256, the load around it."""
    report = out.with_suffix(".json")
    command = [sys.executable, "-m", "onnxsat", "optimize", str(model), str(out), "--quiet"]
    command += ["--region-nodes", "1", "--region-size", str(args.region_size), "--jobs", str(jobs)]
    command += ["--report-json", str(report)]
    command += [] if args.replay else ["--no-region-replay"]
    command += ["--no-verify"] if args.no_verify else []
    command += ["--max-iterations", str(args.iterations)] if args.iterations else []
    load_before = os.getloadavg()[0]
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the CLI and the workers it reaped
    cpu = after.ru_utime + after.ru_stime - usage.ru_utime - usage.ru_stime
    if done.returncode not in (0, 4):
        raise RuntimeError(f"--jobs {jobs} exited {done.returncode}: {done.stderr[-2000:]}")
    data = json.loads(report.read_text())
    stages = data["stage_seconds"]
    return {
        "jobs": jobs,
        "wall": round(wall, 2),
        "cpu": round(cpu, 2),
        "saturation": round(stages.get("regions-saturate", 0.0) + stages.get("regions-windows", 0.0), 2),
        "regions_saturate": stages.get("regions-saturate", 0.0),
        "regions_windows": stages.get("regions-windows", 0.0),
        "verify": round(stages.get("reference", 0.0) + stages.get("verify", 0.0), 2),
        "sha256": hashlib.sha256(out.read_bytes()).hexdigest(),
        "nodes": sum(data["nodes_after"].values()),
        "regions": data["regions"],
        "warnings": data["warnings"],
        "load_before": round(load_before, 2),
        "load_after": round(os.getloadavg()[0], 2),
    }


def _autogroup() -> bool:
    try:
        return Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1"
    except OSError:
        return False


def _ratio(rows: list[dict[str, Any]], key: str) -> float:
    """Median over rounds of (jobs 1 / jobs 2), each round's pair measured back to back."""
    pairs = {}
    for row in rows:
        pairs.setdefault(row["round"], {})[row["jobs"]] = row[key]
    return statistics.median(p[1] / p[2] for p in pairs.values() if 1 in p and 2 in p and p[2] > 0)


def _write(rows: list[dict[str, Any]], args: argparse.Namespace, model: Path, command: str) -> str:
    first = rows[0]["regions"]
    sat, wall = _ratio(rows, "saturation"), _ratio(rows, "wall")
    lines = [
        "# `--jobs 2` against `--jobs 1`: a 24-layer Llama-style decoder saturated by regions",
        "",
        f"Written by `{command}` ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores).",
        "",
        f"Model: `{model.name}` ({args.layers} layers, hidden {HIDDEN}, {HEADS} heads, FFN {FFN}"
        f"{' + 16 per layer' if args.vary_ffn else ''}, vocab {VOCAB}, sequence {SEQUENCE} static, TorchScript"
        f" opset 17), {rows[0]['nodes']} nodes after. Regions of ~{args.region_size} nodes: {first['regions']} regions,"
        f" {first['distinct']} saturated, {first['replayed']} replayed (replay {'on' if args.replay else 'off'}),"
        f" {first['windows']} windows. Verification {'off' if args.no_verify else 'on'}.",
        "",
        "Each round runs both settings as fresh CLI processes back to back (order alternated per round).",
        "Saturation stage = `regions-saturate + regions-windows` of the report (every distinct region and",
        "window loaded, saturated, extracted and exported); end to end = the process's wall time.",
        "",
        "| round | jobs | saturation s | end to end s | CPU s (all processes) | verification s | load before/after | output sha256 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['round']} | {row['jobs']} | {row['saturation']:.2f} | {row['wall']:.2f} | {row['cpu']:.1f}"
            f" | {row['verify']:.2f}"
            f" | {row['load_before']} / {row['load_after']} | `{row['sha256'][:12]}` |"
        )
    same = len({row["sha256"] for row in rows}) == 1
    lines += [
        "",
        f"**Speed-up (median of per-round ratios): saturation {sat:.2f}x (floor 1.6x), end to end {wall:.2f}x"
        f" (floor 1.3x).** Outputs byte-identical across every run: {'yes' if same else 'NO'}.",
        "",
        "A load average above the core count means other work shared the cores: only the interleaved",
        "ratios above count then, and the figures should be rerun on a quiet machine. CPU s is the user",
        "and system time of the run's processes (the CLI and its workers): what the run needs of the",
        "cores whatever the load; a wall time far above CPU s / jobs is time spent waiting for a core.",
        "",
    ]
    if _autogroup():
        lines += [
            "This kernel groups CPU time by session (`/proc/sys/kernel/sched_autogroup_enabled` = 1): under",
            "contention the processes of one run share one group's slice, so a busy machine shows the extra",
            "CPU of the workers' start-up, not their parallelism. The floors are for a quiet machine.",
            "",
        ]
    text = "\n".join(lines)
    if args.write:
        kept = RESULTS.read_text().split(SCALING, 1) if RESULTS.exists() else []
        RESULTS.write_text(text + (SCALING + kept[1] if len(kept) == 2 else ""))  # the scaling notes stay
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--vary-ffn", action="store_true", help="every layer its own FFN width (688 + 16 k)")
    parser.add_argument(
        "--replay", action="store_true", help="keep replay of identical regions on (default off)"
    )
    parser.add_argument(
        "--region-size", type=int, default=100, help="target nodes per region (default 100: one layer)"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--iterations", type=int, default=0, help="--max-iterations for every run (0: the default)"
    )
    parser.add_argument("--no-verify", action="store_true")
    parser.add_argument("--workdir", default="/tmp/onnxsat-jobs-speedup")
    parser.add_argument("--python-export", default=EXPORT_PYTHON, help="a Python with torch and transformers")
    parser.add_argument("--no-write", dest="write", action="store_false", help=f"do not write {RESULTS.name}")
    parser.add_argument("--export-only", metavar="PATH", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.export_only:
        export_decoder(Path(args.export_only), args.layers, args.vary_ffn)
        return 0
    model = _model(args)
    rows: list[dict[str, Any]] = []
    for r in range(args.rounds):
        for jobs in (1, 2) if r % 2 == 0 else (2, 1):
            row = _run(model, Path(args.workdir) / f"out-jobs{jobs}.onnx", jobs, args)
            row["round"] = r + 1
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "regions"}), flush=True)
    command = "python benchmarks/jobs_speedup.py " + " ".join(argv if argv is not None else sys.argv[1:])
    print(_write(rows, args, model, command.strip()))
    return 0 if len({row["sha256"] for row in rows}) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
