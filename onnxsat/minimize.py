"""Find a minimal set of rules that still makes verification fail (for the error message).

Delta debugging by elimination: turn off whole families, then single rules, keeping each one
off whenever the failure persists without it, within ``Options.minimize_seconds``.
"""

from __future__ import annotations

import time

import onnx

from onnxsat.options import Options
from onnxsat.report import Report


def _fails(original: onnx.ModelProto, options: Options, rules: list[str]) -> bool:
    from onnxsat.pipeline import _rewrite
    from onnxsat.verification import compare_models

    try:
        optimized = _rewrite(original, options, rules, Report())
    except Exception:
        return True
    result = compare_models(original, optimized, seeds=options.verify_seeds)
    return not result.ok and not result.skipped_reason


def minimal_failing_rules(original: onnx.ModelProto, options: Options, enabled: list[str]) -> list[str]:
    """A subset of ``enabled`` that still fails, minimal under single-rule removal when time allows."""
    from onnxsat.rules.schedule import FAMILIES

    deadline = time.monotonic() + options.minimize_seconds
    quiet = Options(**{**options.__dict__, "progress": False})
    current = list(enabled)
    for family in FAMILIES.values():
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
