"""``onnxsat batch INPUTS... -o OUTDIR``: many models on a process pool or on Ray (``onnxsat.batch``).

The flags that set a run's options are ``optimize``'s own (``onnxsat.cli_args``); ``--jobs`` here
counts models in parallel, each optimized in one process.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from onnxsat.base.errors import BadInputError
from onnxsat.cli_args import (
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_UNVERIFIED,
    PROG,
    add_model_output_flags,
    add_optimize_flags,
    int_arg,
    options_from_args,
)

_EPILOG = """\
examples:
  onnxsat batch models/ -o optimized/
  onnxsat batch a.onnx b.onnx @more.txt -o out/ --jobs 4 --max-iterations 6
  onnxsat batch zoo/ -o out/ --ray                          # a local Ray instance
  onnxsat batch zoo/ -o out/ --ray-address ray://head:10001 # a Ray cluster (shared filesystem)

Each model's output is OUTDIR/<stem>.onnx (a clashing stem gets a suffix from its input's path)
with a sidecar OUTDIR/<stem>.onnx.onnxsat.json; a rerun skips the models whose input, options and
onnxsat version are unchanged (--force redoes them). The summary (per model: status, nodes, cost,
seconds, verification, error) goes to OUTDIR/summary.json.

exit status:
  0 every model written, unchanged or skipped; 1 a model failed or was refused (the others are
  done); 2 bad flag, no models, unusable output folder, --ray without Ray; 4 a model was written
  without verification (--allow-unverified); 130 interrupted (the summary lists what was done).
"""


def add_parser(sub: Any) -> None:
    """Register the ``batch`` subcommand on ``sub`` (the CLI's subparsers)."""
    p = sub.add_parser(
        "batch",
        help="optimize many models (files, folders, @list files) on a process pool or on Ray",
        description=(
            "Optimize every model INPUTS name into OUTDIR: one progress line, a JSON summary, never\n"
            "stopped by one bad model, resumable. Each model is checked and written as `optimize`\n"
            "would (atomically, only after verification)."
        ),
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "inputs",
        metavar="INPUT",
        nargs="+",
        help="an ONNX file, a folder (searched for *.onnx), or @FILE listing paths one per line",
    )
    p.add_argument(
        "-o", "--output-dir", dest="outdir", metavar="OUTDIR", required=True, help="where outputs go"
    )
    run = p.add_argument_group("batch")
    run.add_argument(
        "--summary",
        metavar="PATH",
        default=None,
        help="write the JSON summary here (default OUTDIR/summary.json)",
    )
    run.add_argument(
        "--jobs",
        metavar="N",
        type=int_arg(1),
        default=None,
        help="models optimized in parallel on this machine (default: one per core, at most one per model;"
        " 1: in this process); with --ray, the cores of the local Ray instance",
    )
    run.add_argument("--force", action="store_true", help="redo every model, even those a previous run did")
    run.add_argument("--ray", action="store_true", help="run each model as a task on a local Ray instance")
    run.add_argument(
        "--ray-address",
        metavar="ADDR",
        default=None,
        help="run on the Ray cluster at ADDR (ray://HOST:10001, HOST:6379 or auto); implies --ray",
    )
    run.add_argument(
        "--task-cpus",
        metavar="N",
        type=int_arg(1),
        default=1,
        help="cores each Ray task requests (default 1)",
    )
    run.add_argument(
        "--no-shared-fs",
        action="store_true",
        help="Ray workers do not see the input and output folders: ship each model's bytes through the"
        " object store (once) and its output back (models with external data cannot be shipped)",
    )
    run.add_argument("--quiet", action="store_true", help="no progress line and no closing counts")
    run.add_argument("--json", action="store_true", help="print the summary JSON on stdout (no progress)")
    add_model_output_flags(p.add_argument_group("output and verification (as optimize)"))
    add_optimize_flags(p)


def run(args: argparse.Namespace) -> int:
    """Run ``onnxsat batch``; returns the exit status."""
    from onnxsat.batch import BatchSummary, ModelResult, run_batch
    from onnxsat.executors import Executor, RayExecutor

    options = options_from_args(args)
    use_ray = args.ray or args.ray_address is not None
    if args.no_shared_fs and not use_ray:
        raise BadInputError(
            "--no-shared-fs needs --ray or --ray-address (a local pool shares this filesystem)"
        )
    executor: Executor | None = None
    if use_ray:
        executor = RayExecutor(args.ray_address, num_cpus=args.jobs, task_cpus=args.task_cpus)

    bar: Any = None
    show = not (args.quiet or args.json)

    def on_plan(n: int) -> None:
        nonlocal bar
        if show:
            from tqdm import tqdm

            bar = tqdm(total=n, unit="model", file=sys.stderr, dynamic_ncols=True, leave=True)

    failed: list[ModelResult] = []

    def on_result(result: ModelResult) -> None:
        if result.status in ("failed", "refused"):
            failed.append(result)
        if bar is not None:
            bar.set_postfix_str(f"{result.status}: {result.input[-40:]}", refresh=False)
            bar.update(1)

    summary: BatchSummary
    try:
        summary = run_batch(
            args.inputs,
            args.outdir,
            options,
            external_data=args.external_data,
            executor=executor,
            jobs=None if use_ray else args.jobs,
            force=args.force,
            shared_fs=not args.no_shared_fs,
            summary_path=args.summary,
            on_result=on_result,
            on_plan=on_plan,
        )
    except KeyboardInterrupt:
        summary_path = args.summary or f"{args.outdir}/summary.json"
        print(f"{PROG}: interrupted; {summary_path} lists the models done", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        if bar is not None:
            bar.close()
        if executor is not None:
            executor.close()
    if args.json:
        print(summary.to_json())
    elif not args.quiet:
        counts = ", ".join(f"{n} {status}" for status, n in summary.counts().items())
        where = "Ray" if use_ray else f"{summary.jobs} process(es)" if summary.jobs > 1 else "this process"
        print(f"{len(summary.models)} models in {summary.seconds:.1f}s on {where}: {counts}")
        print(f"summary: {summary.summary_path}")
    for result in failed:
        print(f"{PROG}: {result.status}: {result.input}: {result.error}", file=sys.stderr)
    if failed:
        return EXIT_INTERNAL
    if any(m.status == "unverified" for m in summary.models):
        return EXIT_UNVERIFIED
    return EXIT_OK
