"""``onnxsat calibrate -o PROFILE.json``: measure the cost model's constants on this machine.

The measuring lives in ``onnxsat.calibrate``; this module is the subcommand's flags and output.
"""

from __future__ import annotations

import argparse
from typing import Any

from onnxsat.base.options import MEASURED_TARGETS
from onnxsat.cli_args import EXIT_OK, int_arg, seconds_arg


def add_parser(sub: Any) -> None:
    """``onnxsat calibrate``: measure the cost model's constants on this machine."""
    cal = sub.add_parser(
        "calibrate",
        help="measure the cost model's constants on this machine and write a profile",
        description=(
            "Time single-node models (MatMul, Gemm, Conv, elementwise, reductions, layout, pooling) at\n"
            "several sizes on the cost target's runtime (ort-cpu: onnxruntime; onnxsat-cpu: compiled by\n"
            "onnxsat, one native call each), fit per op class the roofline constants (peak FLOP/s,\n"
            "bandwidth, per-kernel overhead), and write them as a profile for `optimize --cost-profile`.\n"
            "Prints predicted vs measured time per node; shapes marked held-out were not used in the fit."
        ),
        epilog="example:\n  onnxsat calibrate -o profile.json && onnxsat optimize m.onnx -o o.onnx --cost-profile profile.json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cal.add_argument(
        "-o", "--output", required=True, metavar="PROFILE.json", help="where to write the profile"
    )
    cal.add_argument(
        "--cost-target",
        choices=MEASURED_TARGETS,
        default="ort-cpu",
        help="the cost target to measure: onnxruntime or onnxsat's compiled kernels (default %(default)s)",
    )
    cal.add_argument("--quick", action="store_true", help="fewer shapes and ~3 s of timing (for tests)")
    cal.add_argument(
        "--seconds", type=seconds_arg, default=None, help="timing budget (default 20, or 3 with --quick)"
    )
    cal.add_argument(
        "--threads", type=int_arg(1), default=None, help="threads of the runtime measured (default: its own)"
    )
    cal.add_argument(
        "--check-model",
        metavar="MODEL.onnx",
        action="append",
        default=[],
        help="also compare predicted and measured latency of this whole model (repeatable)",
    )
    cal.add_argument("--json", action="store_true", help="print the fit report as JSON instead of the table")


def run(args: argparse.Namespace) -> int:
    import json

    from onnxsat.base.modelio import check_output_path, load_model
    from onnxsat.calibrate import calibrate, check_models
    from onnxsat.extract.profile import save_profile

    out = check_output_path(args.output)
    models = {path: load_model(path) for path in args.check_model}
    result = calibrate(args.cost_target, quick=args.quick, threads=args.threads, seconds=args.seconds)
    checks = check_models(models, result.cost, threads=args.threads) if models else []
    report = result.report()
    report["models"] = [
        {
            "model": c.name,
            "predicted_us": c.predicted_us,
            "measured_us": c.measured_us,
            "rel_error": c.rel_error,
        }
        for c in checks
    ]
    save_profile(result.cost, out, report)
    if args.json:
        print(json.dumps(report, indent=2))
        return EXIT_OK
    print(result.render())
    for c in checks:
        print(
            f"whole model {c.name}: measured {c.measured_us:,.1f} us, predicted {c.predicted_us:,.1f} us"
            f" ({c.rel_error:.1%} error)"
        )
    print(f"\nwrote {out}")
    return EXIT_OK
