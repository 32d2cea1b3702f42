"""What every ``onnxsat`` subcommand shares: the program name, exit statuses, flag value types, the
plugin flags, and the flags that set a run's ``Options`` (budgets, rules, shapes, cost model,
extraction, verification), so the subcommand modules (``cli``, ``batch_command``, ``rules_command``,
``calibrate_command``, ``compile_command``) parse the same flag the same way.

Imports nothing heavy: ``onnxsat --help`` must answer at once.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from onnxsat.base.errors import BadInputError
from onnxsat.base.options import PHASE_NAMES, TARGET_NAMES, Budgets, Options, PhaseBudget, env_cache_dir

PROG = "onnxsat"

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USAGE = 2
EXIT_UNVERIFIED = 4
EXIT_INTERRUPTED = 130

EXTRACTORS = ("greedy-dag", "tree", "ilp")

_DEFAULT_BUDGETS = Budgets()
_DEFAULT_OPTIONS = Options()


def int_arg(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer of at least ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is below the minimum {minimum}")
        return value

    return parse


def seconds_arg(text: str) -> float:
    """An argparse type: a positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number of seconds") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} must be a positive, finite number of seconds")
    return value


def _percent_arg(text: str) -> float:
    """An argparse type: a finite, non-negative percentage."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text} must be a finite percentage of at least 0")
    return value


def add_plugin_flags(group: Any) -> None:
    """``--rules FILE``, ``--no-plugins`` and ``--strict-plugins``, shared by optimize and rules list/verify."""
    group.add_argument(
        "--rules",
        dest="rule_files",
        metavar="FILE.py",
        action="append",
        default=[],
        help="also load the rule plugin in FILE.py (defines PLUGIN; repeatable); its rules are verified"
        " before use, see docs/plugins.md",
    )
    group.add_argument(
        "--no-plugins",
        action="store_true",
        help="do not load the installed plugins of the onnxsat.rules entry-point group (their code runs"
        " on every invocation otherwise; the report lists each one loaded)",
    )
    group.add_argument(
        "--strict-plugins",
        action="store_true",
        help="fail (exit 2) when a plugin does not load or a plugin rule fails verification,"
        " instead of warning and going on without it",
    )


def plugin_cache_dir() -> str:
    """Where plugin verdicts and built rules are kept between runs: $ONNXSAT_CACHE_DIR, else
    $XDG_CACHE_HOME/onnxsat or ~/.cache/onnxsat."""
    chosen = env_cache_dir()
    if chosen is not None:
        return chosen
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "onnxsat")


def existing_files(paths: Sequence[str]) -> list[str]:
    """``--rules`` files, each of which must exist (an error even under --quiet, before any work)."""
    for path in paths:
        if not Path(path).is_file():
            raise BadInputError(f"--rules {path}: no such file")
    return list(paths)


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


def add_region_flags(group: Any) -> None:
    """``--region-nodes``, ``--region-size`` and ``--no-region-replay``: how a large graph is
    saturated (``optimize`` adds ``--jobs`` for its regions; ``batch``'s ``--jobs`` is models)."""
    group.add_argument(
        "--region-nodes",
        type=int,
        metavar="N",
        default=_DEFAULT_OPTIONS.region_nodes,
        help="saturate graphs of more than N nodes region by region, identical regions once"
        f" (default {_DEFAULT_OPTIONS.region_nodes}; 0: always the whole graph)",
    )
    group.add_argument(
        "--region-size",
        type=int,
        metavar="N",
        default=_DEFAULT_OPTIONS.region_size,
        help=f"target nodes per region (default {_DEFAULT_OPTIONS.region_size})",
    )
    group.add_argument(
        "--no-region-replay",
        action="store_true",
        help="saturate every region on its own instead of replaying the program of an identical one"
        " (a result no worse, slower: for measuring)",
    )


def add_model_output_flags(group: Any) -> None:
    """What the written model looks like and how it is checked: shared by ``optimize`` and ``batch``."""
    group.add_argument(
        "--external-data",
        action="store_true",
        help="store weights in a sidecar file OUTPUT.data next to OUTPUT (automatic past 2 GiB)",
    )
    group.add_argument(
        "--materialize-constants",
        action="store_true",
        help="fold weight-only subgraphs however much larger the weights get (a transposed copy of a weight still read elsewhere); by default by at most --fold-growth",
    )
    group.add_argument(
        "--fold-growth",
        metavar="PERCENT",
        type=_percent_arg,
        default=_DEFAULT_OPTIONS.fold_growth * 100,
        help="how much larger folding constants may make the weights, in percent of the input's, plus 4 KiB"
        " (a Range of positions, a window mask; the report states it) (default %(default)g; 0: never larger)",
    )
    group.add_argument("--no-verify", action="store_true", help="skip the numeric check against the original")
    add_region_flags(group)
    group.add_argument(
        "--verify-inputs",
        metavar="FILE.npz",
        action="append",
        default=[],
        help="verify on this sample instead of random inputs: an .npz whose arrays are named after the"
        " model's inputs (repeatable, one sample per file; like onnx-simplifier's --test-input)",
    )
    group.add_argument(
        "--allow-unverified",
        action="store_true",
        help="write the optimized model even when it cannot be verified (the report says unverified,"
        " a warning is printed and the exit status is 4); without it such a model is an error (exit 2)",
    )


def add_optimize_flags(parser: Any) -> None:
    """The budget, rule, shape, cost-model and extraction flags: shared by ``optimize`` and ``batch``."""
    bud = parser.add_argument_group("saturation budgets (saturation stops at the first one reached)")
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

    sel = parser.add_argument_group("rules, shapes and extraction")
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
        help="write fused nodes as onnxruntime com.microsoft contrib ops (Gelu, FastGelu,"
        " QuickGelu; SkipSimplifiedLayerNormalization, MultiHeadAttention and RotaryEmbedding where the"
        " model keeps an opset below 23) instead of their chains of standard ops, where onnxruntime's CPU"
        " provider runs them; the model then runs on onnxruntime only",
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


def _flatten(groups: Sequence[Sequence[str]]) -> tuple[str, ...]:
    seen: dict[str, None] = {}
    for group in groups:
        for name in group:
            seen.setdefault(name, None)
    return tuple(seen)


def options_from_args(args: argparse.Namespace) -> Options:
    """Map parsed ``optimize`` (or ``batch``) flags onto ``Options``; flags not given keep the dataclass
    defaults. ``Options.jobs`` (one model's regions on workers) is ``optimize --jobs``; ``batch --jobs``
    counts models, each optimized with one."""
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
        budget_changes["phases"] = tuple(
            (name, PhaseBudget(**limits)) for name, limits in phase_limits.items()
        )

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
        fold_growth=args.fold_growth / 100,
        allow_contrib_ops=args.allow_contrib_ops,
        upgrade_opset=None if args.keep_opset else _DEFAULT_OPTIONS.upgrade_opset,
        progress=not (args.quiet or args.json),
        dump_dir=getattr(args, "dump_dir", None),  # optimize only
        region_nodes=args.region_nodes,
        region_size=args.region_size,
        region_replay=not args.no_region_replay,
        jobs=getattr(args, "region_jobs", 1),
    )
