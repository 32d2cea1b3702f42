"""The ``onnxsat`` command line: flags -> ``Options``, then load, optimize, verify, write.

Kept thin on purpose: every decision about the model lives in ``onnxsat.pipeline``; this module
only parses flags, fails early on unusable paths, and turns exceptions into one-line messages
and exit codes (0 ok, 1 internal error, 2 bad input or usage, 3 verification failed, 130
interrupted). Heavy imports (onnx, egglog, onnxruntime) happen inside ``_run_optimize`` so that
``onnxsat --help`` answers instantly.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from onnxsat.base.errors import BadInputError, OnnxsatError, one_line
from onnxsat.base.options import PHASE_NAMES, TARGET_NAMES, Budgets, Options, PhaseBudget
from onnxsat.cli_args import (
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_UNVERIFIED,
    EXIT_USAGE,
    PROG,
    add_plugin_flags,
    add_region_flags,
    existing_files,
    int_arg,
    plugin_cache_dir,
    seconds_arg,
)

if TYPE_CHECKING:
    import onnx


__all__ = ["build_parser", "main", "options_from_args", "parse_input_shape"]

EXTRACTORS = ("greedy-dag", "tree", "ilp")

_DEFAULT_BUDGETS = Budgets()
_DEFAULT_OPTIONS = Options()

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


def parse_input_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """Parse ``NAME:D1,D2,...`` into ``(name, dims)``; raises ``ValueError`` with a readable reason.

    The name is split off at the last colon, since ONNX input names may themselves contain colons.
    """
    name, sep, dims_text = text.rpartition(":")
    if not sep:
        raise ValueError(f"'{text}' is not NAME:D1,D2,... (missing ':')")
    if not name:
        raise ValueError(f"'{text}' has no input name before ':'")
    if not dims_text.strip():
        raise ValueError(f"'{text}' has no dimensions after ':'")
    dims: list[int] = []
    for part in dims_text.split(","):
        part = part.strip()
        try:
            dim = int(part)
        except ValueError:
            raise ValueError(f"'{text}': dimension '{part}' is not an integer") from None
        if dim < 1:
            raise ValueError(f"'{text}': dimension {dim} must be a positive integer")
        dims.append(dim)
    return name, tuple(dims)


def _input_shape_arg(text: str) -> tuple[str, tuple[int, ...]]:
    try:
        return parse_input_shape(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _name_list_arg(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"'{text}' names no rules")
    return names


def parse_phase_budget(text: str) -> tuple[str, PhaseBudget]:
    """``algebra:iterations=4,seconds=5`` -> ("algebra", PhaseBudget(4, None, 5.0)); ValueError if malformed."""
    name, sep, limits = text.rpartition(":")
    if not sep or not limits:
        raise ValueError(f"'{text}' is not PHASE:KEY=VALUE[,KEY=VALUE...]")
    if name not in PHASE_NAMES and not (name.startswith("plugin:") and len(name) > len("plugin:")):
        raise ValueError(f"unknown phase '{name}' (phases: {', '.join(PHASE_NAMES)}, plugin:FAMILY)")
    parsers = {"iterations": int_arg(0), "enodes": int_arg(1), "seconds": seconds_arg}
    values: dict[str, Any] = {}
    for item in limits.split(","):
        key, eq, value = item.strip().partition("=")
        if not eq or key not in parsers:
            raise ValueError(f"'{item}' is not KEY=VALUE with KEY one of {', '.join(parsers)}")
        try:
            values[key] = parsers[key](value.strip())
        except argparse.ArgumentTypeError as e:
            raise ValueError(f"{key}: {e}") from None
    return name, PhaseBudget(**values)


def _phase_budget_arg(text: str) -> tuple[str, PhaseBudget]:
    try:
        return parse_phase_budget(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


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
        "--external-data",
        action="store_true",
        help="store weights in a sidecar file OUTPUT.data next to OUTPUT (automatic past 2 GiB)",
    )
    out.add_argument(
        "--materialize-constants",
        action="store_true",
        help="fold weight-only subgraphs even where the result makes the weights larger (a transposed copy of a weight still read elsewhere); by default folding never does",
    )
    out.add_argument(
        "--quiet", action="store_true", help="print nothing on success: no progress bars, no table"
    )
    out.add_argument(
        "--json",
        action="store_true",
        help="print the report as JSON on stdout instead of the table (no progress)",
    )
    out.add_argument("--no-verify", action="store_true", help="skip the numeric check against the original")
    add_region_flags(out, _DEFAULT_OPTIONS.region_nodes, _DEFAULT_OPTIONS.region_size)
    out.add_argument(
        "--dump-dir",
        metavar="DIR",
        help="write each stage's artefact to DIR: saturation.json (e-graph size, rule report),"
        " extracted.json (the chosen program), optimized.onnx, verification.npz (inputs and both"
        " models' outputs)",
    )
    out.add_argument(
        "--verify-inputs",
        metavar="FILE.npz",
        action="append",
        default=[],
        help="verify on this sample instead of random inputs: an .npz whose arrays are named after the"
        " model's inputs (repeatable, one sample per file; like onnx-simplifier's --test-input)",
    )
    out.add_argument(
        "--allow-unverified",
        action="store_true",
        help="write the optimized model even when it cannot be verified (the report says unverified,"
        " a warning is printed and the exit status is 4); without it such a model is an error (exit 2)",
    )
    out.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS,
        help="show the full traceback of internal errors instead of one line",
    )

    bud = opt.add_argument_group("saturation budgets (saturation stops at the first one reached)")
    bud.add_argument(
        "--max-iterations",
        metavar="N",
        type=int_arg(0),
        default=None,
        help=f"rewrite iterations (default {_DEFAULT_BUDGETS.iterations})",
    )
    bud.add_argument(
        "--max-enodes",
        metavar="N",
        type=int_arg(1),
        default=None,
        help=f"e-graph size limit in e-nodes (default {_DEFAULT_BUDGETS.enodes})",
    )
    bud.add_argument(
        "--time-limit",
        metavar="SECONDS",
        type=seconds_arg,
        default=None,
        help="wall time of the rewrite, import included: saturation gets what the import leaves, and a"
        " graph not imported in time comes back unchanged (default: no such limit, and"
        f" {_DEFAULT_BUDGETS.seconds:g} s of saturation)",
    )
    bud.add_argument(
        "--match-limit",
        metavar="N",
        type=int_arg(1),
        default=None,
        help=(
            "matches per rule per iteration before egglog's back-off scheduler bans the rule "
            f"(default {_DEFAULT_BUDGETS.match_limit})"
        ),
    )
    bud.add_argument(
        "--phase-budget",
        metavar="PHASE:KEY=VALUE,...",
        type=_phase_budget_arg,
        action="append",
        default=[],
        help=(
            "own limits of one schedule phase inside the global ones (repeatable), e.g."
            " algebra:iterations=4,seconds=5; keys iterations, enodes, seconds; phases "
            f"{', '.join(PHASE_NAMES)}, plugin:FAMILY (default: global iterations and e-nodes, an equal"
            f" share of the time left; multi iterations={_DEFAULT_BUDGETS.k_multi})"
        ),
    )

    sel = opt.add_argument_group("rules, shapes and extraction")
    sel.add_argument(
        "--input-shape",
        metavar="NAME:D1,D2,...",
        type=_input_shape_arg,
        action="append",
        default=[],
        help="pin the symbolic dims of input NAME to this full shape (repeatable), e.g. input:1,3,224,224",
    )
    sel.add_argument(
        "--rules-only",
        metavar="NAME,...",
        type=_name_list_arg,
        action="append",
        default=[],
        help="run only these rules or rule families (comma-separated, repeatable)",
    )
    sel.add_argument(
        "--disable-rules",
        metavar="NAME,...",
        type=_name_list_arg,
        action="append",
        default=[],
        help="never run these rules or rule families (comma-separated, repeatable)",
    )
    sel.add_argument(
        "--enable-rules",
        metavar="NAME,...",
        type=_name_list_arg,
        action="append",
        default=[],
        help="also run these default-off rules or families, e.g. partial (PET partial-equivalence rules,"
        " each site verified at the model's shapes before it enters the e-graph)",
    )
    add_plugin_flags(sel)
    sel.add_argument(
        "--cost-target",
        choices=TARGET_NAMES,
        default=_DEFAULT_OPTIONS.target,
        help="cost model the extractor minimizes: ort-cpu prices what onnxruntime runs (with its own"
        " fusions), onnxsat-cpu onnxsat's CPU kernels, h200 an NVIDIA H200 from published figures"
        " (default %(default)s)",
    )
    sel.add_argument(
        "--cost-profile",
        metavar="PROFILE.json",
        default=None,
        help="use the cost constants measured by `onnxsat calibrate` (the profile's target must match --cost-target)",
    )
    sel.add_argument(
        "--measure",
        action="store_true",
        help="time original and optimized model on onnxruntime (interleaved rounds, medians, bootstrap 95%% CI)"
        " and write the optimized model only if its whole CI of the speed-up lies above 1.02; else write"
        " the original with exact simplifications only (core rules), or unchanged if that is slower",
    )
    sel.add_argument(
        "--allow-contrib-ops",
        action="store_true",
        help="write fused nodes as onnxruntime com.microsoft contrib ops (Gelu, BiasGelu, FastGelu,"
        " QuickGelu, SkipSimplifiedLayerNormalization) instead of their chains of standard ops; the model"
        " then runs on onnxruntime only",
    )
    sel.add_argument(
        "--keep-opset",
        action="store_true",
        help="never convert the model to a newer opset; by default a model below opset 23 is converted"
        " as a whole (onnx's version converter, then verified) when a fused node is a standard op there"
        " (RMSNormalization) that onnxruntime runs",
    )
    sel.add_argument(
        "--extractor",
        choices=EXTRACTORS,
        default=_DEFAULT_OPTIONS.extractor,
        help="greedy-dag counts a shared tensor once; tree counts it per use; ilp is exact (HiGHS),"
        " warm-started from greedy-dag, and reports its gap (default %(default)s)",
    )
    sel.add_argument(
        "--ilp-time-limit",
        type=seconds_arg,
        default=_DEFAULT_OPTIONS.ilp_time_limit,
        metavar="SECONDS",
        help="time limit of the ilp extractor; on expiry its best solution and gap are used (default %(default)s)",
    )
    from onnxsat import calibrate_command, compile_command, rules_command

    rules_command.add_parser(sub)
    calibrate_command.add_parser(sub)
    compile_command.add_parser(sub)
    return parser


def _flatten(groups: Sequence[Sequence[str]]) -> tuple[str, ...]:
    seen: dict[str, None] = {}
    for group in groups:
        for name in group:
            seen.setdefault(name, None)
    return tuple(seen)


def options_from_args(args: argparse.Namespace) -> Options:
    """Map parsed ``optimize`` flags onto ``Options``; flags not given keep the dataclass defaults."""
    budget_changes: dict[str, Any] = {}
    for flag, field_name in (
        ("max_iterations", "iterations"),
        ("max_enodes", "enodes"),
        ("time_limit", "seconds"),
        ("match_limit", "match_limit"),
    ):
        value = getattr(args, flag)
        if value is not None:
            budget_changes[field_name] = value
    if args.time_limit is not None:  # the user's limit is on the run, not on saturation alone
        budget_changes["whole_run"] = True
    phase_limits: dict[str, dict[str, Any]] = {}
    for name, own in args.phase_budget:  # a phase given twice: later keys win
        phase_limits.setdefault(name, {}).update({k: v for k, v in vars(own).items() if v is not None})
    if phase_limits:
        budget_changes["phases"] = tuple((name, PhaseBudget(**limits)) for name, limits in phase_limits.items())

    input_shapes: dict[str, tuple[int, ...]] = {}
    for name, dims in args.input_shape:
        if name in input_shapes and input_shapes[name] != dims:
            raise BadInputError(f"--input-shape given twice for input '{name}' with different shapes")
        input_shapes[name] = dims

    return Options(
        budgets=Budgets(**budget_changes),
        rules_only=_flatten(args.rules_only),
        disable_rules=_flatten(args.disable_rules),
        enable_rules=_flatten(args.enable_rules),
        rule_files=tuple(existing_files(args.rule_files)),
        entry_point_plugins=not args.no_plugins,
        strict_plugins=args.strict_plugins,
        plugin_cache_dir=plugin_cache_dir(),
        target=args.cost_target,
        extractor=args.extractor,
        ilp_time_limit=args.ilp_time_limit,
        cost_profile=args.cost_profile,
        measure=args.measure,
        verify=not args.no_verify,
        verify_inputs=tuple(args.verify_inputs),
        allow_unverified=args.allow_unverified,
        input_shapes=input_shapes,
        materialize_constants=args.materialize_constants,
        allow_contrib_ops=args.allow_contrib_ops,
        upgrade_opset=None if args.keep_opset else _DEFAULT_OPTIONS.upgrade_opset,
        progress=not (args.quiet or args.json),
        dump_dir=args.dump_dir,
        region_nodes=args.region_nodes,
        region_size=args.region_size,
        region_replay=not args.no_region_replay,
        jobs=args.jobs,
    )


# ---------------------------------------------------------------------------------------------
# running


def _output_path(args: argparse.Namespace) -> str:
    if args.output_pos is not None and args.output_opt is not None:
        raise BadInputError("give the output path once: either as OUTPUT or with -o, not both")
    out = args.output_pos if args.output_pos is not None else args.output_opt
    if out is None:
        raise BadInputError("no output path: give OUTPUT or -o OUTPUT")
    return out


def _check_input_shapes(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> None:
    """Reject ``--input-shape`` pins that name no graph input or contradict its declared shape.

    Done right after loading so a typo costs seconds, not a saturation run.
    """
    initializers = {t.name for t in model.graph.initializer}
    inputs = {vi.name: vi for vi in model.graph.input if vi.name not in initializers}
    for name, dims in shapes.items():
        if name not in inputs:
            known = ", ".join(sorted(inputs)) or "none"
            raise BadInputError(f"--input-shape names '{name}', which is not a graph input (inputs: {known})")
        ttype = inputs[name].type.tensor_type
        if not ttype.HasField("shape"):
            continue  # rank unknown: the pin defines it
        declared = ttype.shape.dim
        if len(declared) != len(dims):
            raise BadInputError(
                f"--input-shape {name}: {len(dims)} dims given, but the input has rank {len(declared)}"
            )
        for axis, (d, pinned) in enumerate(zip(declared, dims, strict=True)):
            if d.HasField("dim_value") and d.dim_value != pinned:
                raise BadInputError(
                    f"--input-shape {name}: dim {axis} is fixed to {d.dim_value} in the model, not {pinned}"
                )


def _write_text_atomic(path: Path, text: str) -> None:
    """Write via a temp file in the same directory and ``os.replace``: never a half-written report."""
    from onnxsat.base import disk_cache

    disk_cache.sweep_temps(path.parent, path.name)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=disk_cache.temp_name_prefix(path.name), suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise BadInputError(f"cannot write {path}: {e.strerror or one_line(e)}") from e


def _run_optimize(args: argparse.Namespace) -> int:
    from onnxsat.base.modelio import (
        check_not_an_input,
        check_output_path,
        check_weights_not_overwritten,
        load_model_and_sources,
        save_model_atomic,
    )

    options = options_from_args(args)
    out_path = check_output_path(_output_path(args), args.input)
    report_path: Path | None = None
    if args.report_json is not None:
        report_path = check_output_path(args.report_json, args.input)
        if report_path.resolve() == out_path.resolve():
            raise BadInputError("--report-json must not be the output model path")

    if options.dump_dir is not None:  # the dump must not overwrite what is read
        from onnxsat import dump

        try:
            Path(options.dump_dir).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise BadInputError(f"--dump-dir {options.dump_dir}: {exc.strerror or exc}") from exc
        for name in (dump.SATURATION, dump.EXTRACTED, dump.OPTIMIZED, dump.VERIFICATION):
            check_output_path(Path(options.dump_dir) / name, args.input)
    if options.cost_profile is not None:  # a bad profile fails now, not after saturation
        from onnxsat.pipeline import cost_model

        cost_model(options)
    # Large external weights stay in their file (held once, mapped by onnxruntime) unless
    # --measure needs the whole model in memory for its latency sessions.
    model, sources = load_model_and_sources(args.input, lazy_external_data=not options.measure)
    check_not_an_input(out_path, sources)
    if report_path is not None:
        check_not_an_input(report_path, sources, what="--report-json path")
    check_weights_not_overwritten(model, out_path, external_data=args.external_data)
    _check_input_shapes(model, options.input_shapes)
    loaded = time.perf_counter()
    if options.verify:  # an unverifiable model or a bad sample file fails now, not after saturation
        from onnxsat.base.errors import UnverifiableError
        from onnxsat.verification_inputs import prepare_samples

        try:
            prepare_samples(model, options)
        except UnverifiableError:
            if not options.allow_unverified:
                raise
    samples_seconds = time.perf_counter() - loaded

    modules = time.perf_counter()  # imported only now: a bad input fails before this fixed cost
    from onnxsat.pipeline import optimize
    from onnxsat.rules.plugins import PluginWarning

    modules_seconds = time.perf_counter() - modules
    warnings.simplefilter("ignore", PluginWarning)  # the report lists them
    # numpy's RuntimeWarnings (overflow, invalid value) from folding and onnx.reference say nothing
    # the user can act on; verification judges the values
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        optimized, report = optimize(model, options)
    if report.verification.status == "failed":
        # The pipeline raises VerificationError; this guards against a report that only records it.
        detail = f" ({report.verification.detail})" if report.verification.detail else ""
        print(f"{PROG}: error: optimized model does not match the original{detail}", file=sys.stderr)
        return 3

    written = time.perf_counter()
    save_model_atomic(optimized, out_path, external_data=args.external_data, input_path=args.input)
    report.stage_seconds["write"] = round(time.perf_counter() - written, 4)
    report.stage_seconds["samples"] = round(samples_seconds, 4)  # verification inputs, checked up front
    report.stage_seconds["modules"] = round(modules_seconds, 4)  # the optimizer's own modules imported
    report.seconds_after_load = round(time.perf_counter() - loaded, 4)
    if report_path is not None:
        _write_text_atomic(report_path, report.to_json() + "\n")

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
