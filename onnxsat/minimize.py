"""Find a minimal set of rules that still makes verification fail (for the error message).

Delta debugging by elimination: turn off whole families, then single rules, keeping each one
off whenever the failure persists without it, within ``Options.minimize_seconds``.
"""

from __future__ import annotations

import time
from dataclasses import replace

import onnx
from egglog import EggSmolError

from onnxsat.options import Options
from onnxsat.report import Report


def _fails(original: onnx.ModelProto, options: Options, rules: list[str]) -> bool:
    from onnxsat.pipeline import _rewrite, compare

    try:
        optimized = _rewrite(original, options, rules, Report())
    except Exception:
        return True
    result, _ = compare(original, optimized, options)
    return not result.ok and not result.skipped_reason


def minimal_failing_rules(original: onnx.ModelProto, options: Options, enabled: list[str]) -> list[str]:
    """A subset of ``enabled`` that still fails, minimal under single-rule removal when time allows."""
    from onnxsat.rules.registry import RULES

    deadline = time.monotonic() + options.minimize_seconds
    quiet = replace(options, progress=False)
    current = list(enabled)
    for family in RULES.families.values():
        if time.monotonic() > deadline:
            return current
        trial = [r for r in current if r not in family]
        if len(trial) < len(current) and _fails(original, quiet, trial):
            current = trial
    for rule in list(current):
        if time.monotonic() > deadline or len(current) == 1:
            break
        trial = [r for r in current if r != rule]
        if _fails(original, quiet, trial):
            current = trial
    return current


def find_unsound_rules(original: onnx.ModelProto, options: Options, enabled: list[str], iteration: int) -> list[str]:
    """Replay saturation up to the iteration that produced conflicting shapes, then try each
    enabled rule alone on that state (egglog push/pop) and return those that reproduce it."""
    from onnxsat.egraph.importer import from_onnx
    from onnxsat.egraph.shapes import shape_rules
    from onnxsat.rules.schedule import rewrite_step, saturate

    program = from_onnx(original, {k: list(v) for k, v in options.input_shapes.items()})
    if iteration:
        budgets = replace(options.budgets, enodes=2**62, seconds=float("inf"))
        saturate(program, budgets, enabled, stop_before=iteration)
    culprits = []
    for name in enabled:
        program.egraph.push()
        try:
            program.egraph.run(rewrite_step([name], options.budgets))
            program.egraph.run(shape_rules.saturate())
        except EggSmolError:
            culprits.append(name)
        finally:
            program.egraph.pop()
    return culprits or enabled
