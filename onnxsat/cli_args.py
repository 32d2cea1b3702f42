"""What every ``onnxsat`` subcommand shares: the program name, exit statuses, flag value types and
the plugin flags, so the subcommand modules (``cli``, ``rules_command``, ``calibrate_command``,
``compile_command``) parse the same flag the same way.

Imports nothing heavy: ``onnxsat --help`` must answer at once.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from onnxsat.base.errors import BadInputError

PROG = "onnxsat"

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USAGE = 2
EXIT_UNVERIFIED = 4
EXIT_INTERRUPTED = 130


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
    """Where verdicts on plugin rules are kept between runs: $XDG_CACHE_HOME/onnxsat or ~/.cache/onnxsat."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "onnxsat")


def existing_files(paths: Sequence[str]) -> list[str]:
    """``--rules`` files, each of which must exist (an error even under --quiet, before any work)."""
    for path in paths:
        if not Path(path).is_file():
            raise BadInputError(f"--rules {path}: no such file")
    return list(paths)


def add_region_flags(group: Any, region_nodes: int, region_size: int) -> None:
    """``--region-nodes``, ``--region-size``, ``--no-region-replay`` and ``--jobs``: how a large
    graph is saturated (shared by every subcommand that optimizes)."""
    group.add_argument(
        "--region-nodes",
        type=int,
        metavar="N",
        default=region_nodes,
        help="saturate graphs of more than N nodes region by region, identical regions once"
        f" (default {region_nodes}; 0: always the whole graph)",
    )
    group.add_argument(
        "--region-size",
        type=int,
        metavar="N",
        default=region_size,
        help=f"target nodes per region (default {region_size})",
    )
    group.add_argument(
        "--no-region-replay",
        action="store_true",
        help="saturate every region on its own instead of replaying the program of an identical one"
        " (a result no worse, slower: for measuring)",
    )
    group.add_argument(
        "--jobs",
        type=int_arg(1),
        metavar="N",
        default=1,
        help="saturate the distinct regions and windows of a region-wise run on N worker processes"
        " (default 1: in this process); the output is byte-identical to --jobs 1 unless a region stops"
        " on its time budget. It does not turn regions on: a graph saturated whole (at or below"
        " --region-nodes, or --region-nodes 0, the default) runs in one process and the report says so",
    )
