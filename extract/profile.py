"""Cost profiles: the built-in targets and the JSON files ``onnxsat calibrate`` writes.

A profile is a ``RooflineCost``: constants per op class, the fusion mode of the runtime that
will execute the output, and where the numbers came from. ``--cost-target`` picks a built-in one;
``--cost-profile FILE`` loads a measured one.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

from ..base.errors import BadInputError
from ..base.options import TARGET_NAMES
from .cost import FUSION_MODES, OP_CLASSES, ClassConstants, RooflineCost

FORMAT = "onnxsat-cost-profile/1"
_RATES = ("peak_gflops", "bandwidth_gbs", "spill_gbs", "cache_bytes", "reorder_gbs", "unblocked_gflops")
"""Positive constants of a class; null in the file means unlimited (no such term)."""

_H200 = ClassConstants(peak_gflops=67_000.0, bandwidth_gbs=4_800.0, overhead_us=4.0)
"""NVIDIA H200 SXM datasheet: 67 TFLOP/s FP32 (CUDA cores), 4.8 TB/s HBM3e; ~4 us per launch."""

_ORT_CPU_POOL = ClassConstants(peak_gflops=15.0, bandwidth_gbs=10.0, overhead_us=2.0)
"""onnxruntime's pooling kernels compare window elements at ~15 GFLOP/s (one per element; fitted
on 3x3 to 13x13 windows by ``onnxsat calibrate`` on the 2-core development machine), far below the
default class's rate: without it a large window looks as cheap as its separable passes' bytes."""

_ORT_CPU, _ONNXSAT_CPU, _H200_TARGET = TARGET_NAMES  # fails here when a target is added without a profile
TARGETS: dict[str, RooflineCost] = {
    cost.name: cost
    for cost in (
        RooflineCost(
            name=_ORT_CPU,
            classes={"pool": _ORT_CPU_POOL},
            fusion="ort",
            source="built-in defaults (run `onnxsat calibrate` to measure)",
        ),
        RooflineCost(
            name=_ONNXSAT_CPU, fusion="onnxsat", source="built-in defaults (onnxsat's CPU kernels, not measured)"
        ),
        RooflineCost(
            name=_H200_TARGET,
            default=_H200,
            view_overhead_us=0.1,
            fusion="none",
            source="published NVIDIA H200 SXM figures (FP32 67 TFLOP/s, 4.8 TB/s), not measured",
        ),
    )
}
"""Built-in profiles per ``--cost-target`` (``base.options.TARGET_NAMES``); none of them is calibrated."""


class ProfileError(BadInputError):
    """A cost-profile file that cannot be used (exit 2)."""


def builtin_profile(target: str) -> RooflineCost:
    if target not in TARGETS:
        raise ProfileError(f"unknown target {target!r} (known: {', '.join(TARGETS)})")
    return TARGETS[target]


def profile_to_dict(cost: RooflineCost, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON form of a profile; ``extra`` (fit report, machine) is stored under ``calibration``."""

    def consts(c: ClassConstants) -> dict[str, float | None]:
        return {
            "peak_gflops": _finite_or_none(c.peak_gflops),
            "bandwidth_gbs": _finite_or_none(c.bandwidth_gbs),
            "overhead_us": c.overhead_us,
            "spill_gbs": _finite_or_none(c.spill_gbs),
            "cache_bytes": _finite_or_none(c.cache_bytes),
            "reorder_gbs": _finite_or_none(c.reorder_gbs),
            "output_us": c.output_us,
            "unblocked_gflops": _finite_or_none(c.unblocked_gflops),
            "reorder_spill": c.reorder_spill,
            "additive": c.additive,
        }

    data: dict[str, Any] = {
        "format": FORMAT,
        "target": cost.name,
        "calibrated": cost.calibrated,
        "source": cost.source,
        "fusion": cost.fusion,
        "run_overhead_us": cost.run_overhead_us,
        "graph_output_us": cost.graph_output_us,
        "view_overhead_us": cost.view_overhead_us,
        "default": consts(cost.default),
        "classes": {name: consts(c) for name, c in sorted(cost.classes.items())},
    }
    if extra:
        data["calibration"] = extra
    return data


def save_profile(cost: RooflineCost, path: str | Path, extra: dict[str, Any] | None = None) -> None:
    """Write the profile atomically (temp file in the same folder, then rename)."""
    path = Path(path)
    text = json.dumps(profile_to_dict(cost, extra), indent=2, sort_keys=True) + "\n"
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_profile(path: str | Path) -> RooflineCost:
    """Read a profile written by ``save_profile``; any problem is a one-line ``ProfileError``."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ProfileError(f"cannot read cost profile {path}: {exc.strerror or exc}") from exc
    except json.JSONDecodeError as exc:
        raise ProfileError(f"cost profile {path} is not JSON: {exc.msg} (line {exc.lineno})") from exc
    try:
        return profile_from_dict(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise ProfileError(f"cost profile {path} is malformed: {exc}") from exc


def profile_from_dict(data: dict[str, Any]) -> RooflineCost:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"expected format {FORMAT!r}")

    def consts(raw: dict[str, Any]) -> ClassConstants:
        over = float(raw["overhead_us"])
        per_output = float(raw.get("output_us", 0.0))
        rates = {k: _none_is_inf(raw.get(k)) for k in _RATES}
        # Files from before the reorder copies spilled on their own: they spilled like the kernel.
        old_spill = rates["bandwidth_gbs"] / rates["spill_gbs"] if math.isfinite(rates["spill_gbs"]) else 1.0
        reorder_spill = float(raw.get("reorder_spill", old_spill))
        fixed = (over, per_output)
        if (
            any(not v > 0 for v in rates.values())
            or not all(v >= 0 and math.isfinite(v) for v in fixed)
            or not (reorder_spill >= 1.0 and math.isfinite(reorder_spill))
        ):
            raise ValueError(f"constants must be positive: {raw}")
        additive = bool(raw.get("additive", False))
        return ClassConstants(overhead_us=over, output_us=per_output, reorder_spill=reorder_spill, additive=additive, **rates)

    classes = {str(k): consts(v) for k, v in dict(data["classes"]).items()}
    unknown = sorted(set(classes) - set(OP_CLASSES))
    if unknown:
        raise ValueError(f"unknown op classes {unknown} (known: {', '.join(OP_CLASSES)})")
    fusion = str(data.get("fusion", "none"))
    if fusion not in FUSION_MODES:
        raise ValueError(f"fusion must be one of {', '.join(FUSION_MODES)}, not {fusion!r}")
    return RooflineCost(
        name=str(data["target"]),
        default=consts(data["default"]),
        classes=classes,
        view_overhead_us=float(data.get("view_overhead_us", 0.2)),
        fusion=fusion,
        run_overhead_us=float(data.get("run_overhead_us", 0.0)),
        graph_output_us=float(data.get("graph_output_us", 0.0)),
        calibrated=bool(data.get("calibrated", False)),
        source=str(data.get("source", "")),
    )


def _finite_or_none(value: float) -> float | None:
    """JSON has no infinity: an absent limit (no compute term, no spill) is stored as null."""
    return value if math.isfinite(value) else None


def _none_is_inf(value: Any) -> float:
    return math.inf if value is None else float(value)
