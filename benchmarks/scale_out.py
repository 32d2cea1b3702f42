"""Scale-out figures: ``batch`` (many models: serially, on a process pool, on local Ray) and ``jobs``
(one model's regions in parallel: ``benchmarks/jobs_speedup.py``).

    python benchmarks/scale_out.py batch                       # the real-model corpus, 3 ways
    python benchmarks/scale_out.py batch --models 8 --jobs 2 --json results.json
    python benchmarks/scale_out.py memory --models 6           # peak RSS of one task per model
    python benchmarks/scale_out.py jobs ...                    # see jobs_speedup.py --help

``batch`` optimizes the small real-model corpus (tests/data/realmodels, INDEX.json) with
``onnxsat.batch.run_batch`` three times into fresh folders: in this process (``--jobs 1``), on a
process pool (``--jobs N``) and on a local Ray instance of N cores (one task per model, one core
each), with the command line's rule-table cache. Budgets are iterations only (the time limit is set far out) so the three must write the
same bytes, which is checked model for model. It prints wall seconds, models per minute, the
speed-up over serial and the 1-minute load average before and after each mode (the machine may
be shared: read the ratios with the load beside them, not as floors). Ray's start-up is timed
apart from its batch.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "data" / "realmodels"


def corpus(limit: int | None) -> list[Path]:
    """The corpus's models in INDEX.json order, smallest graphs first when limited."""
    index = json.loads((CORPUS / "INDEX.json").read_text())
    entries = sorted(index.values(), key=lambda e: e["nodes"]) if limit else list(index.values())
    return [CORPUS / e["file"] for e in entries[:limit]]


def digests(outdir: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(outdir.glob("*.onnx"))}


def one_mode(mode: str, models: list[Path], options: Any, jobs: int, workdir: Path) -> dict[str, Any]:
    """One batch run in ``mode`` (serial, pool or ray) and its figures."""
    from onnxsat.batch import run_batch
    from onnxsat.executors import RayExecutor

    out = workdir / mode
    load_before = os.getloadavg()[0]
    startup = 0.0
    executor = None
    if mode == "ray":
        started = time.perf_counter()
        executor = RayExecutor(num_cpus=jobs)
        startup = time.perf_counter() - started
    start = time.perf_counter()
    try:
        summary = run_batch(
            models, out, options, jobs=1 if mode == "serial" else jobs, executor=executor, force=True
        )
    finally:
        if executor is not None:
            executor.close()
    wall = time.perf_counter() - start
    return {
        "mode": mode,
        "workers": 1 if mode == "serial" else jobs,
        "models": len(models),
        "wall_s": round(wall, 2),
        "startup_s": round(startup, 2),
        "models_per_min": round(60 * len(models) / wall, 2),
        "counts": summary.counts(),
        "load_before": round(load_before, 2),
        "load_after": round(os.getloadavg()[0], 2),
        "digests": digests(out),
    }


def batch_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="scale_out.py batch", description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=int, default=None, help="the N smallest models (default: all)")
    parser.add_argument("--jobs", type=int, default=2, help="pool workers and Ray cores (default 2)")
    parser.add_argument("--max-iterations", type=int, default=4, help="saturation iterations (default 4)")
    parser.add_argument(
        "--modes", default="serial,pool,ray", help="comma-separated, of serial, pool, ray (default all three)"
    )
    parser.add_argument("--json", metavar="PATH", default=None, help="also write the figures as JSON")
    args = parser.parse_args(argv)

    from onnxsat.base.options import Budgets, Options
    from onnxsat.cli_args import plugin_cache_dir
    from onnxsat.executors import ray_available

    models = corpus(args.models)
    # Iterations only: a phase stopped by the clock could differ between runs, and the check below
    # is that the three write the same bytes.
    # The command line's rule-table cache: a worker loads the built rules instead of building them.
    options = Options(
        budgets=Budgets(iterations=args.max_iterations, seconds=3600.0), plugin_cache_dir=plugin_cache_dir()
    )
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if "ray" in modes and not ray_available():
        print("ray is not installed (pip install 'onnxsat[ray]'): skipping the ray mode", file=sys.stderr)
        modes.remove("ray")
    rows = []
    with tempfile.TemporaryDirectory(prefix="scale-out-") as tmp:
        for mode in modes:
            row = one_mode(mode, models, options, args.jobs, Path(tmp))
            rows.append(row)
            print(
                f"{mode:>6}: {row['models']} models, {row['workers']} worker(s): {row['wall_s']:.1f} s wall,"
                f" {row['models_per_min']:.1f} models/min (start-up {row['startup_s']:.1f} s);"
                f" {row['counts']}; load {row['load_before']} -> {row['load_after']}",
                flush=True,
            )
    base = rows[0]
    same = all(r["digests"] == base["digests"] for r in rows)
    for row in rows[1:]:
        print(f"{row['mode']} vs {base['mode']}: x{base['wall_s'] / row['wall_s']:.2f} wall")
    print(f"outputs byte-identical across {', '.join(r['mode'] for r in rows)}: {same}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "identical": same}, indent=2) + "\n")
    return 0 if same else 1


def _vm_hwm_mib() -> float:
    """This process's peak resident set (Linux VmHWM: of this address space only, unlike
    ``ru_maxrss``, which a spawned child inherits from the parent that forked it)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def _peak_rss(path: str, iterations: int) -> dict[str, Any]:
    """In a fresh process: optimize one model as a batch task does; its peak RSS and weight bytes."""
    import onnx

    from onnxsat.base.modelio import weight_bytes
    from onnxsat.base.options import Budgets, Options
    from onnxsat.batch import ModelJob, optimize_one

    out = tempfile.mkdtemp(prefix="scale-out-rss-")
    job = ModelJob(path, os.path.join(out, Path(path).name), Options(budgets=Budgets(iterations=iterations)))
    result = optimize_one(job)
    return {
        "model": Path(path).stem,
        "status": result["status"],
        "weight_mib": round(weight_bytes(onnx.load(path)) / 2**20, 2),
        "file_mib": round(os.path.getsize(path) / 2**20, 2),
        "peak_rss_mib": _vm_hwm_mib(),
    }


def synthetic_mlp(path: Path, weight_mib: int, hidden: int = 1024) -> Path:
    """An MLP of about ``weight_mib`` MiB of inline weights (``tests.models.mlp``), saved at ``path``:
    the corpus's weights are too small to show how memory grows with them."""
    import onnx

    sys.path.insert(0, str(ROOT))
    from tests.models import mlp

    onnx.save(mlp(weight_mib, hidden), str(path))
    return path


def memory_main(argv: list[str]) -> int:
    """Peak RSS of one batch task per model, each in a fresh spawned process: the memory a task
    asks for is about fixed + k x weights (docs/scale.md)."""
    import concurrent.futures as cf
    import multiprocessing

    parser = argparse.ArgumentParser(prog="scale_out.py memory", description=memory_main.__doc__)
    parser.add_argument("--models", type=int, default=None, help="the N smallest models (default: all)")
    parser.add_argument("--max-iterations", type=int, default=4)
    parser.add_argument(
        "--synthetic-mib",
        default="",
        help="also MLPs of these weight sizes in MiB, comma-separated (e.g. 64,256)",
    )
    args = parser.parse_args(argv)
    rows = []
    tmp = Path(tempfile.mkdtemp(prefix="scale-out-mlp-"))
    sizes = [int(s) for s in args.synthetic_mib.split(",") if s.strip()]
    paths = corpus(args.models) + [synthetic_mlp(tmp / f"mlp-{mib}mib.onnx", mib) for mib in sizes]
    for path in paths:
        with cf.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            row = pool.submit(_peak_rss, str(path), args.max_iterations).result()
        rows.append(row)
        print(json.dumps(row), flush=True)
    return 0


def jobs_main(argv: list[str]) -> int:
    """``benchmarks/jobs_speedup.py``'s ``main``: regions of one model in parallel (``--jobs``)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    try:
        module = importlib.import_module("jobs_speedup")
    except ModuleNotFoundError as e:
        if e.name != "jobs_speedup":
            raise
        print("benchmarks/jobs_speedup.py is not here yet: the jobs part is not available", file=sys.stderr)
        return 2
    return int(module.main(argv))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parts = {"batch": batch_main, "memory": memory_main, "jobs": jobs_main}
    if not argv or argv[0] not in parts:
        print(f"usage: python benchmarks/scale_out.py {{{'|'.join(parts)}}} [ARGS...]", file=sys.stderr)
        return 2
    return parts[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
