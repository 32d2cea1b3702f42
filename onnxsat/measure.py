"""``--measure``: time the optimized model against the original and never ship a slower one.

Both models run in onnxruntime on the same seeded inputs, in interleaved rounds
(``onnxsat.latency``). The rule that decides what is written:

1. the optimized model ships when it *wins*: the whole bootstrap 95% interval of the speed-up
   (original time / optimized time) lies above 1.02;
2. otherwise the cleaned-up original ships: the model optimized with the ``core`` family only
   (exact simplifications: cancellations, identities, folding), unless it is measured slower
   than the original (its whole interval below 0.98), in which case
3. the original ships unchanged.

So a model is written only if it is measurably faster or not measurably slower than the input.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import onnx

from onnxsat.latency import LatencyComparison, compare_models

if TYPE_CHECKING:
    from onnxsat.base.options import Options
    from onnxsat.base.report import Report

EXACT_FAMILY = "core"
"""Rules whose result equals the input exactly (up to float rounding of folded weights)."""


@dataclass
class MeasuredLatency:
    """What ``--measure`` found and which model it shipped."""

    optimized: dict[str, Any] | None
    """Original vs optimized: medians (ms), ratio, 95% CI, rounds, verdict (None: not timed)."""
    shipped: str
    """``optimized``, ``cleaned-original`` or ``original``."""
    cleaned: dict[str, Any] | None = None
    """Original vs cleaned-up original, when the optimized model did not win."""
    unmeasured: str | None = None
    """Why nothing could be timed (onnxruntime cannot run the original, e.g. custom-domain ops)."""

    def describe(self) -> str:
        if self.optimized is None:
            return (
                f"cannot time on onnxruntime ({self.unmeasured}): wrote the original with exact"
                f" simplifications only ({EXACT_FAMILY} rules)"
            )
        line = f"original -> optimized {_fmt(self.optimized)}"
        if self.cleaned is not None:
            line += f"; original -> cleaned-up original {_fmt(self.cleaned)}"
        reason = {
            "optimized": "wrote the optimized model",
            "cleaned-original": "the optimized model was not measurably faster: wrote the original with exact"
            f" simplifications only ({EXACT_FAMILY} rules)",
            "original": "neither was measurably faster: wrote the original unchanged",
        }[self.shipped]
        return f"{line}; {reason}"


def _fmt(c: dict[str, Any]) -> str:
    return (
        f"{c['baseline_ms']:.3f} ms -> {c['candidate_ms']:.3f} ms (x{c['ratio']:.3f}, 95% CI"
        f" [{c['ci_low']:.3f}, {c['ci_high']:.3f}], {c['rounds']} rounds: {c['verdict']})"
    )


def _compare(original: onnx.ModelProto, candidate: onnx.ModelProto, options: Options) -> LatencyComparison:
    from onnxsat.verification import make_inputs
    from onnxsat.verification_inputs import pinned_dims

    feeds = make_inputs(original, seed=0, dim_values=pinned_dims(original, options))
    return compare_models(
        original, candidate, feeds, threads=options.measure_threads, rounds=options.measure_rounds
    )


def keep_if_faster(
    original: onnx.ModelProto, optimized: onnx.ModelProto, options: Options, report: Report
) -> onnx.ModelProto:
    """The model to write under the rule in the module docstring; records the evidence in ``report``.

    A model onnxruntime cannot run (custom-domain ops) cannot be timed, so it cannot be measurably
    faster: the cleaned-up original ships, as when the optimized model does not win.
    """
    from onnxsat.pipeline import optimize

    exact = dataclasses.replace(options, rules_only=(EXACT_FAMILY,), measure=False)
    reason = _why_not_runnable(original)
    if reason is not None:
        _record(report, MeasuredLatency(None, "cleaned-original", unmeasured=reason))
        return optimize(original, exact)[0]
    first = _compare(original, optimized, options)
    if first.verdict == "win":
        _record(report, MeasuredLatency(first.to_dict(), "optimized"))
        return optimized
    cleaned, _ = optimize(original, exact)
    second = _compare(original, cleaned, options)
    shipped = "original" if second.verdict == "loss" else "cleaned-original"
    _record(report, MeasuredLatency(first.to_dict(), shipped, second.to_dict()))
    return original if shipped == "original" else cleaned


def _why_not_runnable(model: onnx.ModelProto) -> str | None:
    """onnxruntime's one-line reason for refusing ``model``, or None when it builds a session."""
    from onnxsat.base.errors import one_line
    from onnxsat.latency import ort_session

    try:
        ort_session(model, level="disable")
    except Exception as exc:  # onnxruntime's errors derive from Exception only (Fail, InvalidGraph, ...)
        return one_line(exc)
    return None


def _record(report: Report, result: MeasuredLatency) -> None:
    report.measured = {**dataclasses.asdict(result), "summary": result.describe()}
    if result.shipped != "optimized":
        report.warnings.append(f"--measure: {result.describe()}")
