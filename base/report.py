"""``Report``: what a run did, for people (a table) and machines (JSON).

Per-iteration, per-rule records are kept so research notebooks can study rule effectiveness.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any


class StopReason(StrEnum):
    """What stopped a phase, or saturation as a whole; the values are what reports print and store."""

    SATURATED = "saturated"
    """No rule changed the e-graph any more."""
    ITERATIONS = "iterations"
    """The phase's iteration cap."""
    ENODES = "enodes"
    """The e-node budget (the phase's or the global one)."""
    SECONDS = "seconds"
    """The time budget (the phase's share or the global one)."""
    REPLAYED = "replayed"
    """A replay up to a given iteration (finding the rule behind a conflict) reached it."""
    NO_ITERATIONS = "no iterations"
    """The phase had no budget left to run one iteration."""
    NO_RULES = "no rules enabled"
    """Saturation ran no phase: no enabled rule."""


@dataclass
class IterationRecord:
    """One saturation iteration: e-graph size after it, matches and time per rule."""

    phase: str
    index: int
    enodes: int
    seconds: float
    matches: dict[str, int] = field(default_factory=dict)
    rule_seconds: dict[str, float] = field(default_factory=dict)


@dataclass
class PhaseRecord:
    """One phase of the schedule: how many iterations it ran and which budget stopped it."""

    name: str
    iterations: int
    stop_reason: StopReason
    enodes: int
    """E-graph size when the phase ended."""
    seconds: float
    first_iteration: int = 0
    """Global index of its first iteration in ``SaturationReport.iterations``."""
    rules: int = 0
    """Enabled rules the phase ran."""
    limits: str = ""
    """The phase's own limits (``iterations=4,seconds=5``; empty: only the global budgets)."""


@dataclass
class SaturationReport:
    iterations: list[IterationRecord] = field(default_factory=list)
    stop_reason: StopReason | str = ""
    """Which budget stopped saturation (empty before it ran): saturated (every phase), iterations (a phase's cap),
    enodes, seconds (the global budgets), no rules enabled."""
    enodes_before: int = 0
    enodes_after: int = 0
    seconds: float = 0.0
    phases: list[PhaseRecord] = field(default_factory=list)

    def phase_summary(self) -> str:
        """``analysis saturated, algebra saturated after 3, layout iterations after 12, multi [iterations=1]
        iterations after 1, ...`` (a phase's own limits in brackets)."""
        return ", ".join(
            f"{p.name}{f' [{p.limits}]' if p.limits else ''} {p.stop_reason}"
            + (f" after {p.iterations}" if p.iterations else "")
            for p in self.phases
        )

    def rule_matches(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for it in self.iterations:
            for rule, n in it.matches.items():
                total[rule] = total.get(rule, 0) + n
        return dict(sorted(total.items(), key=lambda kv: (-kv[1], kv[0])))


@dataclass
class VerificationSummary:
    status: str
    """passed, failed, skipped (--no-verify), regionwise (ORT could not run the original whole), or
    unverified (could not be checked; only with --allow-unverified)."""
    detail: str = ""
    max_abs_err: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    """Time verifying added to the run: the original's reference run (or the wait for it, when it ran
    beside the rewrite) plus the optimized model's check."""
    background_seconds: float = 0.0
    """The original's reference run on a thread beside the rewrite (``Session.start_reference``): its
    own wall time, most of it hidden behind the rewrite's stages; 0 when it ran in line."""


@dataclass
class RegionSummary:
    """How a graph above ``Options.region_nodes`` was saturated region by region."""

    threshold: int = 0
    target_size: int = 0
    regions: int = 0
    distinct: int = 0
    """Regions saturated (the others replayed the program of an identical one)."""
    replayed: int = 0
    sizes: list[int] = field(default_factory=list)
    """Nodes per region, in graph order."""
    windows: int = 0
    """Windows around the cuts saturated after stitching (distinct ones; the others replayed)."""
    windows_distinct: int = 0
    windows_replayed: int = 0
    window_hops: int = 0
    merged_by_cse: int = 0
    """Nodes the common-subexpression pass merged after stitching."""
    replay: bool = True
    """Identical regions replayed one program (``Options.region_replay``); off, each saturated."""
    jobs: int = 1
    """Processes the distinct regions and windows were saturated on (``Options.jobs``)."""
    budgets: str = ""
    """The budgets each region and window was saturated under."""
    stop_reasons: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    """partition, saturate (regions), windows, cse, export (fold), check."""
    costs: str = "summed over the regions, each priced as a model of its own"
    """How the report's estimated costs were obtained in a region-wise run."""

    def describe(self) -> str:
        return (
            f"{self.regions} regions of ~{self.target_size} nodes (graph above {self.threshold:,}):"
            f" {self.distinct} saturated, {self.replayed} replayed{'' if self.replay else ' (replay off)'}"
            f"{f' on {self.jobs} worker processes' if self.jobs > 1 else ''}; {self.windows} windows"
            f" ({self.window_hops} hops): {self.windows_distinct} saturated, {self.windows_replayed} replayed;"
            f" {self.merged_by_cse} nodes merged by CSE; {self.budgets}; costs {self.costs}"
        )


@dataclass
class Report:
    """The summary of one optimize run."""

    model_name: str = ""
    opset: int = 0
    opset_after: int = 0
    """The written model's opset: above ``opset`` when the whole model was converted (``--keep-opset`` off)."""
    nodes_before: dict[str, int] = field(default_factory=dict)
    nodes_after: dict[str, int] = field(default_factory=dict)
    cost_before: float = 0.0
    cost_after: float = 0.0
    saturation: SaturationReport = field(default_factory=SaturationReport)
    extractor: str = ""
    extraction_gap: float | None = None
    """ILP only: relative gap to the proven lower bound (0 = optimal)."""
    verification: VerificationSummary = field(default_factory=lambda: VerificationSummary("skipped"))
    stage_seconds: dict[str, float] = field(default_factory=dict)
    background_seconds: dict[str, float] = field(default_factory=dict)
    """Work run on a thread beside the stages (``reference``: the original's verification run), by its
    own wall time: it overlaps ``stage_seconds``, which sum to the run's time."""
    seconds_after_load: float = 0.0
    """The command line's wall time from the model read to the written file (0 from the API)."""
    file_bytes_before: int = 0
    file_bytes_after: int = 0
    unknown_ops: dict[str, int] = field(default_factory=dict)
    opaque_reasons: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    plugins: list[str] = field(default_factory=list)
    """Every rule plugin loaded (entry points and --rules files): their code ran in this process."""
    pinned_dims: dict[str, dict[str, int]] = field(default_factory=dict)
    """``--input-shape``: per input, the dims that were not fixed in the model (symbol or "dim K") -> value."""
    partial: list[dict[str, Any]] = field(default_factory=list)
    """Per-site rules (PET partial rules, and exact ones such as the sub-pixel ConvTranspose): each site
    found (rule, shapes, emitted/rejected/too-large, boxes, and whether the extracted program uses its
    mutant + correction)."""
    dropped_rules: dict[str, str] = field(default_factory=dict)
    """Rules a run left out after they made a rewrite unsound or verification fail -> why."""
    kept_original: str = ""
    """Why the input model was returned unchanged (the result was worse than it), else empty."""
    regions: RegionSummary | None = None
    """Set when the graph was saturated region by region (``Options.region_nodes``)."""
    measured: dict[str, Any] | None = None
    """``--measure``: onnxruntime latency before/after (medians, 95% CI, verdict) and what shipped."""

    @property
    def total_before(self) -> int:
        return sum(self.nodes_before.values())

    @property
    def total_after(self) -> int:
        return sum(self.nodes_after.values())

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["total_nodes_before"] = self.total_before
        data["total_nodes_after"] = self.total_after
        data["rule_matches"] = self.saturation.rule_matches()
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    def render(self) -> str:
        """A plain-text summary table."""
        opset = f"{self.opset} -> {self.opset_after}" if self.opset_after not in (0, self.opset) else f"{self.opset}"
        lines = [f"onnxsat report: {self.model_name} (opset {opset})", ""]
        ops = sorted(set(self.nodes_before) | set(self.nodes_after))
        width = max([len(o) for o in ops] + [8])
        lines.append(f"  {'op':<{width}}  {'before':>7}  {'after':>7}")
        for op in ops:
            b, a = self.nodes_before.get(op, 0), self.nodes_after.get(op, 0)
            mark = "" if a == b else ("  -" if a < b else "  +")
            lines.append(f"  {op:<{width}}  {b:>7}  {a:>7}{mark}")
        lines.append(f"  {'total':<{width}}  {self.total_before:>7}  {self.total_after:>7}")
        lines.append("")
        gain = self.cost_before / self.cost_after if self.cost_after > 0 else float("inf")
        gap = "" if self.extraction_gap is None else f", gap {self.extraction_gap:.1%}"
        lines.append(
            f"  estimated cost   {self.cost_before:,.1f} us -> {self.cost_after:,.1f} us"
            f"  (x{gain:.2f}, extractor {self.extractor}{gap})"
        )
        if self.measured is not None:
            lines.append(f"  measured latency {self.measured['summary']}")
        sat = self.saturation
        lines.append(
            f"  e-graph          {sat.enodes_before} -> {sat.enodes_after} e-nodes, {len(sat.iterations)} iterations,"
            f" stopped by: {sat.stop_reason}"
        )
        if sat.phases:
            lines.append(f"  phases           {sat.phase_summary()}")
        if self.regions is not None:
            lines.append(f"  regions          {self.regions.describe()}")
        fired = sat.rule_matches()
        if fired:
            lines.append("  rules fired      " + ", ".join(f"{k} x{v}" for k, v in fired.items() if v))
        if self.partial:
            emitted = [p for p in self.partial if p["status"] == "emitted"]
            used = [p["rule"] for p in emitted if p["used"]]
            skipped = len(self.partial) - len(emitted)
            lines.append(
                f"  site rules       {len(emitted)} site(s) PET-verified and added"
                + (f" ({', '.join(sorted(set(p['rule'] for p in emitted)))})" if emitted else "")
                + (f", {skipped} not added (verification failed or correction too large)" if skipped else "")
                + f"; extracted program uses: {', '.join(sorted(set(used))) or 'none'}"
            )
        lines.append(f"  file size        {self.file_bytes_before:,} -> {self.file_bytes_after:,} bytes")
        v = self.verification
        took = f", {v.seconds:.2f}s" if v.seconds else ""
        if v.background_seconds:
            took += f"; the original's run, {v.background_seconds:.2f}s, beside the rewrite"
        lines.append(f"  verification     {v.status}" + (f" ({v.detail}{took})" if v.detail else ""))
        if self.unknown_ops:
            lines.append(
                "  opaque ops       " + ", ".join(f"{k} x{n}" for k, n in sorted(self.unknown_ops.items()))
            )
        stages = ", ".join(f"{k} {s:.2f}s" for k, s in self.stage_seconds.items())
        lines.append(f"  time             {stages}")
        if self.pinned_dims:
            pins = "; ".join(
                f"{name}: " + ", ".join(f"{dim}={value}" for dim, value in dims.items())
                for name, dims in self.pinned_dims.items()
            )
            lines.append(f"  pinned dims      {pins} (the output is specialized to these sizes)")
        if self.plugins:
            lines.append("  plugins          " + "; ".join(self.plugins))
        for w in self.warnings:
            lines.append(f"  warning: {w}")
        return "\n".join(lines)
