"""The ``onnxsat`` command line: flags -> ``Options``, then load, optimize, verify, write.

Kept thin on purpose: every decision about the model lives in ``onnxsat.pipeline``; this module
only parses flags, fails early on unusable paths, and turns exceptions into one-line messages
and exit codes (0 ok, 1 internal error, 2 bad input or usage, 3 verification failed, 130
interrupted). Heavy imports (onnx, egglog, onnxruntime) happen inside ``_run_optimize`` so that
``onnxsat --help`` answers instantly.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from onnxsat.base.errors import BadInputError, OnnxsatError, one_line
from onnxsat.cli_args import (
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_UNVERIFIED,
    EXIT_USAGE,
    EXTRACTORS,
    PROG,
    add_model_output_flags,
    add_optimize_flags,
    int_arg,
    options_from_args,
    parse_input_shape,
    parse_phase_budget,
)

__all__ = ["EXTRACTORS", "build_parser", "main", "options_from_args", "parse_input_shape", "parse_phase_budget"]


_OPTIMIZE_EPILOG = """\
examples:
  onnxsat optimize examples/small_cnn.onnx -o small_cnn.opt.onnx
  onnxsat optimize model.onnx model.opt.onnx --input-shape input:1,3,224,224 --report-json report.json
  onnxsat optimize model.onnx -o out.onnx --max-iterations 4 --time-limit 10 --disable-rules <rule-name>
  onnxsat optimize model.onnx -o out.onnx --json --external-data > report.json

exit status:
  0 written; 1 internal error; 2 bad input, bad flag, unwritable output, or a model that cannot
  be verified (nothing written; see --verify-inputs); 3 the optimized model did not match the
  original (nothing written); 4 written without verification (--allow-unverified); 130 interrupted.
"""

_MAIN_EPILOG = """\
example:
  onnxsat optimize examples/small_cnn.onnx -o small_cnn.opt.onnx

Run 'onnxsat optimize --help' for every flag.
"""



# ---------------------------------------------------------------------------------------------
# flag parsing


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("onnxsat")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    """The argument parser, built in one place so the help text shows every flag and default."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=(
            "Equality-saturation optimizer for ONNX models: rewrites the graph in an e-graph\n"
            "(egglog), extracts the cheapest equivalent program, checks it against the original\n"
            "on onnxruntime, and writes it as ONNX."
        ),
        epilog=_MAIN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument(
        "--debug", action="store_true", help="show the full traceback of internal errors instead of one line"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    opt = sub.add_parser(
        "optimize",
        help="optimize an ONNX model and write the result",
        description=(
            "Optimize INPUT and write the result to OUTPUT (given as OUTPUT or -o OUTPUT).\n"
            "The input file is never modified. The output is written atomically, and only after\n"
            "the optimized model passes onnx.checker and (unless --no-verify) matches the original\n"
            "on onnxruntime with seeded random inputs. The summary table goes to stdout, progress\n"
            "bars and errors to stderr."
        ),
        epilog=_OPTIMIZE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    opt.add_argument("input", metavar="INPUT", help="the ONNX model to optimize (read only)")
    opt.add_argument(
        "output_pos", metavar="OUTPUT", nargs="?", default=None, help="where to write the optimized model"
    )
    opt.add_argument(
        "-o",
        "--output",
        dest="output_opt",
        metavar="OUTPUT",
        default=None,
        help="same as the OUTPUT positional",
    )

    out = opt.add_argument_group("output and reporting")
    out.add_argument(
        "--report-json",
        metavar="PATH",
        default=None,
        help="also write the report as JSON to PATH (atomically)",
    )
    out.add_argument(
        "--quiet", action="store_true", help="print nothing on success: no progress bars, no table"
    )
    out.add_argument(
        "--json",
        action="store_true",
        help="print the report as JSON on stdout instead of the table (no progress)",
    )
    out.add_argument(
        "--dump-dir",
        metavar="DIR",
        help="write each stage's artefact to DIR: saturation.json (e-graph size, rule report),"
        " extracted.json (the chosen program), optimized.onnx, verification.npz (inputs and both"
        " models' outputs)",
    )
    out.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS,
        help="show the full traceback of internal errors instead of one line",
    )
    add_model_output_flags(out)
    out.add_argument(
        "--jobs",
        dest="region_jobs",
        type=int_arg(1),
        metavar="N",
        default=1,
        help="saturate the distinct regions and windows of a region-wise run on N worker processes"
        " (default 1: in this process); the output is byte-identical to --jobs 1 unless a region stops"
        " on its time budget. It does not turn regions on: a graph saturated whole (at or below"
        " --region-nodes, or --region-nodes 0, the default) runs in one process and the report says so",
    )

    add_optimize_flags(opt)
    from onnxsat import batch_command, calibrate_command, compile_command, rules_command

    batch_command.add_parser(sub)
    rules_command.add_parser(sub)
    calibrate_command.add_parser(sub)
    compile_command.add_parser(sub)
    return parser


# ---------------------------------------------------------------------------------------------
# running


def _output_path(args: argparse.Namespace) -> str:
    if args.output_pos is not None and args.output_opt is not None:
        raise BadInputError("give the output path once: either as OUTPUT or with -o, not both")
    out = args.output_pos if args.output_pos is not None else args.output_opt
    if out is None:
        raise BadInputError("no output path: give OUTPUT or -o OUTPUT")
    return out


def _run_optimize(args: argparse.Namespace) -> int:
    from onnxsat.base.modelio import check_output_path
    from onnxsat.file_run import load_checked, optimize_loaded, write_result, write_text_atomic

    options = options_from_args(args)
    out_path = check_output_path(_output_path(args), args.input)
    report_path: Path | None = None
    if args.report_json is not None:
        report_path = check_output_path(args.report_json, args.input)
        if report_path.resolve() == out_path.resolve():
            raise BadInputError("--report-json must not be the output model path")
    loaded = load_checked(
        args.input, out_path, options, external_data=args.external_data, report_path=report_path
    )
    optimized, report = optimize_loaded(loaded, options)
    if report.verification.status == "failed":
        # The pipeline raises VerificationError; this guards against a report that only records it.
        detail = f" ({report.verification.detail})" if report.verification.detail else ""
        print(f"{PROG}: error: optimized model does not match the original{detail}", file=sys.stderr)
        return 3
    write_result(
        optimized,
        report,
        out_path,
        external_data=args.external_data,
        input_path=args.input,
        loaded_at=loaded.loaded_at,
    )
    if report_path is not None:
        write_text_atomic(report_path, report.to_json() + "\n")

    if args.quiet:  # what changed the written model (a plugin rule left out, ...) still shows
        for text in report.warnings:
            print(f"{PROG}: warning: {text}", file=sys.stderr)
    if args.json:
        print(report.to_json())
    elif not args.quiet:
        print(report.render())
        print(f"\nwrote {out_path}" + (f" (+ {out_path.name}.data)" if args.external_data else ""))
    if report.verification.status == "unverified":
        print(f"{PROG}: warning: wrote {out_path} WITHOUT verification ({report.verification.detail})", file=sys.stderr)
        return EXIT_UNVERIFIED
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``onnxsat`` console script and ``python -m onnxsat``; returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, --version and usage errors; keep main() returning an int
        return e.code if isinstance(e.code, int) else (EXIT_OK if e.code is None else EXIT_USAGE)

    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE

    try:
        if args.command == "rules":
            from onnxsat import rules_command

            return rules_command.run(args)
        if args.command == "batch":
            from onnxsat import batch_command

            return batch_command.run(args)
        if args.command == "calibrate":
            from onnxsat import calibrate_command

            return calibrate_command.run(args)
        if args.command == "compile":
            from onnxsat import compile_command

            return compile_command.run(args)
        return _run_optimize(args)
    except OnnxsatError as e:
        print(f"{PROG}: error: {one_line(e)}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; nothing written", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as e:
        if args.debug:
            raise
        print(
            f"{PROG}: internal error: {type(e).__name__}: {one_line(e)} (rerun with --debug for a traceback)",
            file=sys.stderr,
        )
        return EXIT_INTERNAL
