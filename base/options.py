"""``Options``: every budget and setting of a run, passed down explicitly (no globals)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

FOLD_GROWTH_FLOOR = 4096
"""Bytes folding may add besides ``Options.fold_growth``: a small model's size constants fit."""
PHASE_NAMES = ("algebra", "layout", "partial", "multi", "fusion")
"""The default schedule's in-tree phases (``rules/schedule.py`` builds them from these names); plugin
families add ``plugin:FAMILY``."""
TARGET_NAMES = ("ort-cpu", "onnxsat-cpu", "h200")
"""The built-in cost-model targets (``Options.target``, ``--cost-target``; their profiles are
``extract/profile.py``'s)."""
MEASURED_TARGETS = TARGET_NAMES[:2]
"""The targets ``onnxsat calibrate`` can measure here: onnxruntime, and onnxsat's compiled CPU kernels."""
CACHE_DIR_ENV = "ONNXSAT_CACHE_DIR"
"""Environment variable naming the cache folder: ``Options``' default, and the CLI's before
``$XDG_CACHE_HOME/onnxsat`` (a notebook kernel or a worker process started with it reads the built
rules instead of building them, ~3 s per process)."""


def env_cache_dir() -> str | None:
    """``$ONNXSAT_CACHE_DIR``, or None when it is unset or empty."""
    return os.environ.get(CACHE_DIR_ENV) or None


@dataclass(frozen=True)
class PhaseBudget:
    """One schedule phase's own limits, inside the global ones (None: the global iteration and
    e-node budgets, and for time an equal share of what is left)."""

    iterations: int | None = None
    enodes: int | None = None
    seconds: float | None = None

    def describe(self) -> str:
        """``iterations=4,seconds=5`` (the limits that are set), as ``--phase-budget`` takes them."""
        return ",".join(f"{k}={v:g}" for k, v in vars(self).items() if v is not None)


@dataclass(frozen=True)
class Budgets:
    """Limits on exploration; saturation stops at the first one reached (the report says which)."""

    iterations: int = 12
    enodes: int = 60_000
    seconds: float = 30.0
    whole_run: bool = False
    """``seconds`` bounds the whole rewrite, import included (``--time-limit``): saturation gets
    what the import left, and an import that runs past it returns the input unchanged. Off, it
    bounds saturation alone (the default of the API, whose callers set their own limits)."""
    match_limit: int = 2_000
    """egglog back-off scheduler: matches per rule per iteration before the rule is banned."""
    ban_length: int = 3
    k_multi: int = 1
    """Iterations of multi-pattern rules (TENSAT's k_multi): the multi phase runs after the algebra and layout phases."""
    phases: tuple[tuple[str, PhaseBudget], ...] = ()
    """Own limits per schedule phase name (algebra, layout, partial, multi, fusion, plugin:FAMILY;
    ``--phase-budget``); a phase named twice in the schedule (algebra, layout) has them each time.
    A multi-phase iteration limit here replaces ``k_multi``."""

    def phase(self, name: str) -> PhaseBudget:
        """The own limits of phase ``name`` (all None when it has none)."""
        return next((own for phase, own in self.phases if phase == name), PhaseBudget())


@dataclass(frozen=True)
class Options:
    """Settings of one ``onnxsat.optimize`` run."""

    budgets: Budgets = field(default_factory=Budgets)
    rules_only: tuple[str, ...] = ()
    """Run only these rules (names or family names); empty = all."""
    disable_rules: tuple[str, ...] = ()
    enable_rules: tuple[str, ...] = ()
    """Also run these default-off rules or families (``partial``: PET rules, verified at the model's shapes)."""
    rule_files: tuple[str, ...] = ()
    """Plugin files (``--rules``), each a Python file defining ``PLUGIN``; see docs/plugins.md."""
    entry_point_plugins: bool = True
    """Load the installed plugins of the ``onnxsat.rules`` entry-point group."""
    strict_plugins: bool = False
    """A plugin that fails to load or a plugin rule that fails verification is an error, not a warning."""
    plugin_cache_dir: str | None = field(default_factory=env_cache_dir)
    """Where plugin rules' verification verdicts and the built in-tree rules are cached between
    processes (None: verify and build in every process); by default ``$ONNXSAT_CACHE_DIR``. The
    CLI uses that or ``$XDG_CACHE_HOME/onnxsat``."""
    target: str = "ort-cpu"
    """Cost-model target: ort-cpu (what onnxruntime runs, with its fusions), onnxsat-cpu or h200."""
    cost_profile: str | None = None
    """A profile file from ``onnxsat calibrate`` (its target must equal ``target``); None: built-in."""
    extractor: str = "greedy-dag"
    """greedy-dag (default), tree (egglog-style tree costs, for comparison) or ilp (exact, HiGHS)."""
    ilp_time_limit: float = 30.0
    verify: bool = True
    verify_seeds: tuple[int, ...] = (0, 1)
    verify_inputs: tuple[str, ...] = ()
    """``--verify-inputs``: .npz files of sample inputs (array names = input names), one sample per
    file; verification runs on these instead of generated inputs (onnx-simplifier's --test-input)."""
    verify_samples: tuple[dict, ...] = ()
    """Sample inputs given in memory (input name -> array), used like ``verify_inputs``."""
    allow_unverified: bool = False
    """Return/write a model that could not be verified (its report says ``unverified``); otherwise
    that is an error (``UnverifiableError``, exit 2)."""
    input_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """Pins symbolic input dims: name -> full shape."""
    allow_contrib_ops: bool = False
    """Write fused kinds as onnxruntime com.microsoft contrib ops (BiasGelu, FastGelu...) instead of chains."""
    upgrade_opset: int | None = 23
    """Opset the whole model may be converted to (onnx's version converter, then verified like every
    output) so fused nodes can be written as that opset's standard ops (RMSNormalization); it is
    converted only when the extracted program holds one. None keeps the model's opset."""
    materialize_constants: bool = False
    """Fold weight-only subgraphs however much larger that makes the weights (``fold_growth`` is ignored)."""
    fold_growth: float = 0.01
    """How much larger folding constants may make the weights: this fraction of the input's weight
    bytes plus `FOLD_GROWTH_FLOOR` (0: never larger). Exporters compute tensors such as Swin's window
    mask from sizes; folding them removes their subgraph and adds its output to the weights."""
    fold_elements: int | None = None
    """Before the import, fold a weight-only subgraph only where its result has at most this many
    elements or all are equal (None: any size). A region's run sets it (``onnxsat.by_regions``): its
    program is replayed on twins with other weights; the stitched model is folded whole."""
    declare_symbols: frozenset[str] = frozenset()
    """Tables whose rules are declared besides those the model's import fills (``egraph.reach``). A
    region's run gets the whole graph's (``onnxsat.by_regions``), so every region declares one rule
    set and reuses one e-graph (rules whose tables a region lacks never match in it)."""
    minimize_seconds: float = 120.0
    """Time budget for finding a minimal failing rule set when verification fails."""
    seed_invented_dims: bool = True
    """Seed the sizes ONNX shape inference names but cannot compute (``unk__0``) at import; a run in
    which a rewrite lets the analysis compute one (two shapes meet) is repeated without them."""
    observe_shapes: bool = True
    """Run the model once on onnxruntime for the sizes ONNX shape inference leaves open where they
    provably cannot depend on the input values (``onnxsat.static_shapes``), and seed the analysis
    with them; every graph input's shape must be fixed (declared or pinned)."""
    rule_retries: int = 2
    """When a rewrite is found unsound or verification fails: how many reruns without the rules
    found responsible, before the last resort, a run without rewrites (``onnxsat.pipeline``)."""
    region_nodes: int = 3000
    """Graphs with more nodes than this (after the sizes are folded: ``Session.source``) are
    saturated region by region (``onnxsat.by_regions``): cut where few tensors cross, each distinct
    region saturated once with the full budgets and replayed on its identical twins, then the
    windows around the cuts; 0: always whole. Below ~3,000 nodes a whole-graph run is faster (a
    region costs its own import and declarations); above, identical layers solved once win (a
    64-layer decoder: 2,378 nodes in 7.8 s by regions, 2,382 in 8.8 s whole)."""
    region_size: int = 200
    """Target nodes per region when saturating by regions."""
    region_window_hops: int = 3
    """How many edges either side of a cut the window saturated after stitching reaches (0: none)."""
    region_replay: bool = True
    """Replay a distinct region's program on its identical twins (same computation, other weights)
    instead of saturating each twin again; off, every region is saturated on its own (a result
    no worse, at the cost of saturating the twins: for measuring, or when a key is in doubt)."""
    jobs: int = 1
    """Worker processes that saturate the distinct regions and windows of a region-wise run
    (``onnxsat.jobs``); 1: in this process. The output is the same for every value whenever no
    region stops on a time budget. It spreads region-wise work only: it does not turn regions on."""
    progress: bool = False
    dump_dir: str | None = None
    """A folder each stage of the run writes its artefact to (``onnxsat/dump.py``); None: nothing written."""
    measure: bool = False
    """Time original vs optimized on onnxruntime and never ship a slower model (``onnxsat.measure``)."""
    measure_rounds: int = 30
    measure_threads: int | None = None
    """onnxruntime intra-op threads while measuring (None: its default)."""

    def fold_limit(self, input_weight_bytes: int) -> float:
        """The most weight bytes folding constants may leave in a model whose input had
        ``input_weight_bytes`` (``fold_growth``; no limit with ``materialize_constants``)."""
        if self.materialize_constants:
            return math.inf
        if self.fold_growth <= 0:
            return float(input_weight_bytes)
        return input_weight_bytes * (1 + self.fold_growth) + FOLD_GROWTH_FLOOR
