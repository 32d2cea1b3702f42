"""Find a minimal set of rules that still makes verification fail (for the error message).

Delta debugging: first look for one family that fails alone (runs with few rules are cheap),
then eliminate whole families and single rules, keeping each one off whenever the failure
persists without it, within ``Options.minimize_seconds``.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING

import onnx
from egglog import EggSmolError

from onnxsat.base.options import Options

if TYPE_CHECKING:
    from onnxsat.egraph.program import Program
    from onnxsat.rules.registry import RuleTable
    from onnxsat.verification import Reference


def _fails(original: onnx.ModelProto, options: Options, rules: list[str], reference: Reference | None) -> bool:
    from onnxsat.pipeline import Session, compare

    try:
        with Session(original, options, rules=rules) as session:
            optimized = session.rewrite()
    except Exception:
        return True
    result, _ = compare(original, optimized, options, reference)
    return not result.ok and not result.skipped_reason


def minimal_failing_rules(
    original: onnx.ModelProto, options: Options, enabled: list[str], reference: Reference | None = None
) -> list[str]:
    """A subset of ``enabled`` that still fails, minimal under single-rule removal when time allows.

    ``reference``: the original's outputs on the verification inputs (the user's samples
    included), reused by every trial instead of running the original again.
    """
    from onnxsat.rules.plugins import load_plugins

    table = load_plugins(options)[0]  # the run's rule table
    deadline = time.monotonic() + options.minimize_seconds
    quiet = replace(options, progress=False)
    current = list(enabled)
    for family in table.families.values():  # one family alone is a cheap run: try that first
        alone = [r for r in current if r in family]
        if time.monotonic() > deadline:
            return current
        if 0 < len(alone) < len(current) and _fails(original, quiet, alone, reference):
            current = alone
            break
    for family in table.families.values():
        if time.monotonic() > deadline:
            return current
        trial = [r for r in current if r not in family]
        if len(trial) < len(current) and _fails(original, quiet, trial, reference):
            current = trial
    for rule in list(current):
        if time.monotonic() > deadline or len(current) == 1:
            break
        trial = [r for r in current if r != rule]
        if _fails(original, quiet, trial, reference):
            current = trial
    return current


def find_unsound_rules(original: onnx.ModelProto, options: Options, enabled: list[str], iteration: int) -> list[str]:
    """Replay saturation up to the iteration that produced conflicting shapes, then try the
    enabled rules on that state (egglog push/pop) and return those that reproduce it alone.

    Group testing: each family is tried as a whole first and only the rules of families that
    conflict are tried one by one, so naming the culprit costs a run per family plus a run per
    suspect rule instead of a run per rule.
    """
    from onnxsat.egraph.importer import from_onnx
    from onnxsat.rules.plugins import load_plugins, plugin_ops
    from onnxsat.rules.schedule import saturate

    table, loads = load_plugins(options)  # the run's rule table
    with plugin_ops(loads):
        program = from_onnx(
            original, {k: list(v) for k, v in options.input_shapes.items()}, seed_invented=options.seed_invented_dims
        )
        if iteration:
            budgets = replace(options.budgets, enodes=2**62, seconds=float("inf"))
            saturate(program, budgets, enabled, stop_before=iteration, table=table)
        wanted = set(enabled)
        grouped = [[r for r in family if r in wanted] for family in table.families.values()]
        suspects = []
        for group in grouped:
            if len(group) == 1 or (group and _conflicts(program, group, options, table)):
                suspects.extend(group)
        culprits = [name for name in suspects if _conflicts(program, [name], options, table)]
    return culprits or suspects or enabled


def _conflicts(program: Program, rules: list[str], options: Options, table: RuleTable) -> bool:
    """Whether one iteration of ``rules`` on the current state makes the shape analysis conflict."""
    from onnxsat.rules.schedule import rewrite_step

    program.egraph.push()
    try:
        only = program.selection.rewrites if program.selection is not None else None
        program.egraph.run(rewrite_step(rules, options.budgets, table, only))
        program.egraph.run(program.analysis().saturate())
    except EggSmolError:
        return True
    finally:
        program.egraph.pop()
    return False
