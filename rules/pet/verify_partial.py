"""Verification of partial rules by PET's method, at the concrete shapes of each site.

PET (Wang et al., OSDI 2021) splits an output into boxes inside which every position's
summation interval moves with the position (here: the boxes a site's ``cuts`` define, edges
where a window edge crosses an input border or a tile seam). For multilinear ops, original and
mutant agree on a whole box once they agree on m+1 positions of it (a corner and its neighbour
along each of the m axes) for random inputs. So, in float64 on several seeds:

1. evaluate original, mutant and composite (mutant + correction) with ``onnx.reference``;
2. classify each box as differing or not from its m+1 positions;
3. check the full random outputs agree with that classification (a differing position inside an
   agreeing box means the declared cuts are wrong), and that every differing box lies inside the
   declared correction slabs;
4. check the composite equals the original everywhere.

A site is verified only if all hold. Ops that are not multilinear (MaxPool) get the same checks,
but step 2 is then a random test, not PET's proof; the verdict says so.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
from egglog import EGraph
from onnx import TensorProto, helper

from ...egraph import lang as L
from ...egraph.program import Program
from ..verification.rule_instances import OPSET, RTOL, compare, term_graph

SEEDS = 3


@dataclass
class PetVerdict:
    """The outcome of PET's check on one site."""

    ok: bool
    detail: str
    boxes: int = 0
    differing_boxes: int = 0
    positions_checked: int = 0
    max_abs_err: float = 0.0
    seconds: float = 0.0


def _program(site: Any, outputs: int) -> Program:
    """A synthetic program whose inputs are the site's leaves (float64) and ``outputs`` outputs."""
    inputs = [helper.make_tensor_value_info(n, TensorProto.DOUBLE, list(s)) for n, (_, s, _) in site.leaves.items()]
    names = [f"y{i}" for i in range(outputs)]
    graph = helper.make_graph([], "partial-site", inputs, [helper.make_empty_tensor_value_info(n) for n in names])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    return Program(
        egraph=cast(EGraph, None),  # the exporter reads only the side tables
        model=model,
        opset=OPSET,
        outputs=[(n, L.Tensor.none()) for n in names],
        names=[],
        weights={},
        opaque={},
        symbols={},
        true_inputs=list(site.leaves),
        overridable=set(),
    )


def _windows(x: np.ndarray, kernel: Any, strides: Any, pads: Any, dilations: Any, fill: float) -> np.ndarray:
    """Every pooling window of ``x`` (ceil_mode 0, explicit pads filled with ``fill``), window axes last."""
    rank = len(kernel)
    strides, dilations = strides or [1] * rank, dilations or [1] * rank
    pads = pads or [0] * (2 * rank)
    padded = np.pad(x, [(0, 0), (0, 0), *((pads[i], pads[rank + i]) for i in range(rank))], constant_values=fill)
    extent = [(k - 1) * d + 1 for k, d in zip(kernel, dilations, strict=True)]
    windows = np.lib.stride_tricks.sliding_window_view(padded, extent, axis=tuple(range(2, 2 + rank)))
    return windows[(slice(None), slice(None), *(slice(None, None, s) for s in strides), *(slice(None, None, d) for d in dilations))]


def max_pool_reference(x: np.ndarray, kernel: Any, strides: Any, pads: Any, dilations: Any) -> np.ndarray:
    """MaxPool (ceil_mode 0, explicit pads) in numpy: the max over each window of the input padded with -inf."""
    return cast(np.ndarray, _windows(x, kernel, strides, pads, dilations, -np.inf).max(axis=tuple(range(-len(kernel), 0))))


def average_pool_reference(x: np.ndarray, kernel: Any, strides: Any, pads: Any, count_include_pad: int) -> np.ndarray:
    """AveragePool (ceil_mode 0, explicit pads) in numpy: each window's sum over the kernel size, or
    over the number of in-bounds positions when padding does not count."""
    axes = tuple(range(-len(kernel), 0))
    total = _windows(x, kernel, strides, pads, None, 0.0).sum(axis=axes)
    if count_include_pad:
        return cast(np.ndarray, total / float(np.prod(kernel)))
    ones = np.ones((1, 1, *x.shape[2:]), dtype=x.dtype)
    return cast(np.ndarray, total / _windows(ones, kernel, strides, pads, None, 0.0).sum(axis=axes))


def conv_transpose_reference(
    x: np.ndarray, w: np.ndarray, b: np.ndarray | None, strides: Any, pads: Any, dilations: Any, group: int, output_padding: Any
) -> np.ndarray:
    """ConvTranspose (explicit pads, no output_shape) in numpy: each kernel position's contribution
    scattered with the stride into the uncropped output, which the pads then crop."""
    rank = x.ndim - 2
    strides, dilations = list(strides or [1] * rank), list(dilations or [1] * rank)
    pads, extra = list(pads or [0] * (2 * rank)), list(output_padding or [0] * rank)
    kernel = w.shape[2:]
    full = [(x.shape[2 + i] - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 + extra[i] for i in range(rank)]
    per_in, per_out = x.shape[1] // group, w.shape[1]
    out = np.zeros((x.shape[0], per_out * group, *full), dtype=np.result_type(x, w))
    for g in range(group):
        xs, ws = x[:, g * per_in : (g + 1) * per_in], w[g * per_in : (g + 1) * per_in]
        for pos in itertools.product(*(range(k) for k in kernel)):
            at = tuple(
                slice(pos[i] * dilations[i], pos[i] * dilations[i] + strides[i] * (x.shape[2 + i] - 1) + 1, strides[i])
                for i in range(rank)
            )
            taps = ws[(slice(None), slice(None), *pos)]  # type: ignore[arg-type]
            out[(slice(None), slice(g * per_out, (g + 1) * per_out), *at)] += np.einsum("nc...,cm->nm...", xs, taps)
    crop = tuple(slice(pads[i], full[i] - pads[rank + i]) for i in range(rank))
    out = out[(slice(None), slice(None), *crop)]
    if b is not None:
        out = out + b.reshape(1, -1, *([1] * rank))
    return cast(np.ndarray, out)


def numpy_pool_ops() -> list[type]:
    """onnx.reference's MaxPool and AveragePool with the common case (one output, ceil_mode 0,
    explicit pads, no dilation for averages) in numpy: the reference's stride-1 MaxPool fails on a
    kernel with a dimension of 1 (onnx 1.23: "zero-size array to reduction operation maximum"),
    which separable pooling's passes have, and its general paths loop in Python (seconds per
    site). ConvTranspose with explicit pads too (the reference's col2im loops in Python: 44 s on a
    [1, 64, 28, 28] input). Other cases keep the reference."""
    from onnx.reference.ops import op_average_pool, op_conv_transpose, op_max_pool

    def common(node: Any, ceil_mode: Any, auto_pad: Any) -> bool:
        return len(node.output) == 1 and not ceil_mode and auto_pad in (None, "NOTSET")

    class MaxPool(op_max_pool.MaxPool):  # type: ignore[misc]
        def _run(self, x, auto_pad=None, ceil_mode=None, dilations=None, kernel_shape=None, pads=None, storage_order=None, strides=None):  # type: ignore[no-untyped-def]
            if common(self.onnx_node, ceil_mode, auto_pad):
                return (max_pool_reference(x, kernel_shape, strides, pads, dilations),)
            return self._max_pool(
                x, auto_pad=auto_pad, ceil_mode=ceil_mode, dilations=dilations, kernel_shape=kernel_shape,
                pads=pads, storage_order=storage_order, strides=strides,
            )

    class AveragePool(op_average_pool.AveragePool_19):  # type: ignore[misc,name-defined]
        def _run(self, x, auto_pad=None, ceil_mode=None, count_include_pad=None, dilations=None, kernel_shape=None, pads=None, strides=None):  # type: ignore[no-untyped-def]
            if common(self.onnx_node, ceil_mode, auto_pad) and all(d == 1 for d in dilations or ()):
                return (average_pool_reference(x, kernel_shape, strides, pads, count_include_pad or 0),)
            return super()._run(
                x, auto_pad=auto_pad, ceil_mode=ceil_mode, count_include_pad=count_include_pad, dilations=dilations,
                kernel_shape=kernel_shape, pads=pads, strides=strides,
            )

    class ConvTranspose(op_conv_transpose.ConvTranspose):  # type: ignore[misc]
        def _run(self, X, W, B=None, auto_pad=None, dilations=None, group=None, kernel_shape=None, output_padding=None, output_shape=None, pads=None, strides=None):  # type: ignore[no-untyped-def]
            if auto_pad in (None, "NOTSET") and output_shape is None:
                return (conv_transpose_reference(X, W, B, strides, pads, dilations, group or 1, output_padding),)
            return super()._run(
                X, W, B, auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape,
                output_padding=output_padding, output_shape=output_shape, pads=pads, strides=strides,
            )

    return [MaxPool, AveragePool, ConvTranspose]


def evaluate(program: Program, graph: Any, feeds: list[dict[str, np.ndarray]]) -> list[list[np.ndarray]]:
    """Export the site's terms and run them with ``onnx.reference`` once per feed."""
    from onnx.reference import ReferenceEvaluator

    from ...egraph.exporter import to_onnx

    evaluator = ReferenceEvaluator(to_onnx(program, graph), new_ops=numpy_pool_ops())
    with np.errstate(all="ignore"):
        return [[np.asarray(v) for v in evaluator.run(None, f)] for f in feeds]


def _boxes(cuts: list[list[int]]) -> list[tuple[tuple[int, int], ...]]:
    return list(itertools.product(*[list(zip(c[:-1], c[1:], strict=True)) for c in cuts]))


def _probe_positions(box: tuple[tuple[int, int], ...]) -> list[tuple[int, ...]]:
    """PET's m+1 positions of a box: its low corner and the next position along each axis."""
    corner = tuple(lo for lo, _ in box)
    out = [corner]
    for axis, (lo, hi) in enumerate(box):
        if hi - lo > 1:
            out.append(tuple(c + (1 if i == axis else 0) for i, c in enumerate(corner)))
    return out


def _inside(box: tuple[tuple[int, int], ...], slabs: list[tuple[int, int, int]]) -> bool:
    return any(a <= box[axis][0] and box[axis][1] <= b for axis, a, b in slabs)


def _slab_mask(shape: tuple[int, ...], slabs: list[tuple[int, int, int]]) -> np.ndarray:
    mask = np.zeros(shape, dtype=bool)
    for axis, a, b in slabs:
        index = [slice(None)] * len(shape)
        index[axis] = slice(a, b)
        mask[tuple(index)] = True
    return mask


def _differs(ref: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Positions where ``out`` is not ``ref`` beyond float64 rounding (NaN/inf compared as values)."""
    scale = max(1.0, float(np.nanmax(np.abs(ref[np.isfinite(ref)]), initial=0.0)))
    close = np.isclose(out, ref, rtol=RTOL, atol=RTOL * scale, equal_nan=True)
    return cast(np.ndarray, ~close)


def verify_site(site: Any, seeds: int = SEEDS) -> PetVerdict:
    """PET's check of one ``partial.Site`` at its own shapes (see the module docstring)."""
    start = time.perf_counter()
    n = len(site.originals)
    graph = term_graph(*site.originals, *site.mutants, *site.composites)
    rng_feeds = []
    for seed in range(seeds):
        rng = np.random.default_rng([seed, 0x9E7])
        rng_feeds.append({name: rng.standard_normal(shape) for name, (_, shape, _) in site.leaves.items()})
    try:
        runs = evaluate(_program(site, 3 * n), graph, rng_feeds)
    except Exception as exc:  # the reference rejects a term: the site proves nothing
        return PetVerdict(False, f"the reference cannot evaluate the site: {type(exc).__name__}: {exc}".splitlines()[0])
    verdict = PetVerdict(True, "")
    kind = "PET boxes (m+1 positions each)" if site.multilinear else "boxes by random tests (not multilinear)"
    for o in range(n):
        shape = tuple(site.out_shapes[o])
        originals = [r[o] for r in runs]
        for name, k in (("mutant", n + o), ("composite", 2 * n + o)):
            got = runs[0][k]
            if got.shape != shape:
                return _fail(verdict, start, f"output {o}: the {name} has shape {list(got.shape)}, the original {list(shape)}")
        # 2. classify boxes from m+1 positions per box, on every seed
        boxes = _boxes(site.cuts[o])
        differing: list[tuple[tuple[int, int], ...]] = []
        masks = [_differs(r[o], r[n + o]) for r in runs]
        for box in boxes:
            if not site.multilinear:  # no m+1 theorem: a box differs if any position differs on a seed
                if any(mask[tuple(slice(lo, hi) for lo, hi in box)].any() for mask in masks):
                    differing.append(box)
                continue
            probes = _probe_positions(box)
            verdict.positions_checked += len(probes) * seeds
            if any(mask[p] for mask in masks for p in probes):
                differing.append(box)
        verdict.boxes += len(boxes)
        verdict.differing_boxes += len(differing)
        # 3. the full random outputs agree with the classification; differing boxes are corrected
        claimed = np.zeros(shape, dtype=bool)
        for box in differing:
            claimed[tuple(slice(lo, hi) for lo, hi in box)] = True
        seen = np.logical_or.reduce(masks)
        if np.any(seen & ~claimed):
            where = tuple(int(i) for i in np.argwhere(seen & ~claimed)[0])
            return _fail(verdict, start, f"output {o}: mutant differs at {list(where)} inside a box whose m+1 positions agree (wrong cuts)")
        outside = [box for box in differing if not _inside(box, site.corrections[o])]
        if outside or np.any(seen & ~_slab_mask(shape, site.corrections[o])):
            at = f" (box {outside[0]})" if outside else ""
            return _fail(verdict, start, f"output {o}: the mutant differs outside the corrected regions{at}")
        # 4. the composite is the original everywhere
        for seed, (ref, run) in enumerate(zip(originals, runs, strict=True)):
            ok, err, reason = compare(ref, run[2 * n + o])
            verdict.max_abs_err = max(verdict.max_abs_err, err)
            if not ok:
                return _fail(verdict, start, f"output {o}: mutant + correction != original ({reason}, max abs error {err:.3g}, seed {seed})")
    verdict.seconds = round(time.perf_counter() - start, 3)
    differ = verdict.differing_boxes
    found = f"{differ} of {verdict.boxes} boxes differ, all corrected" if differ else f"none of {verdict.boxes} boxes differs (exact)"
    verdict.detail = f"{kind}: {found}; composite = original on {seeds} seeds"
    return verdict


def _fail(verdict: PetVerdict, start: float, detail: str) -> PetVerdict:
    verdict.ok, verdict.detail = False, detail
    verdict.seconds = round(time.perf_counter() - start, 3)
    return verdict


def verify_partial_rule(name: str) -> Any:
    """The rule-table verifier of a partial rule: PET's check on each site its samples give."""
    from ..registry import RULES
    from ..verification.verify import RuleVerification
    from .partial import PARTIAL_RULES, verify_site_cached

    start = time.perf_counter()
    rule = PARTIAL_RULES[name]
    sites = rule.find(rule.samples(), None)
    result = RuleVerification(name, RULES.family_of(name), False, 0, "", candidates=len(sites))
    failures = []
    boxes = differing = 0
    for site in sites:
        verdict, _ = verify_site_cached(site)
        if not verdict.ok:
            failures.append(verdict.detail)
            continue
        result.instances_fired += 1
        boxes, differing = boxes + verdict.boxes, differing + verdict.differing_boxes
    result.variants_fired = {name: result.instances_fired}
    result.seconds = round(time.perf_counter() - start, 3)
    if failures:
        result.detail = f"PET check failed on {len(failures)} of {len(sites)} sites: {failures[0]}"
    elif not sites:
        result.detail = "no site found on the rule's samples"
    else:
        result.ok = True
        found = f"{differing} of {boxes} boxes differ, all corrected" if differing else f"none of {boxes} boxes differs (exact)"
        result.detail = f"PET-verified at {len(sites)} sample shapes: {found}"
    return result


def composite_model(site: Any, original: Any, leaf_names: dict[str, str]) -> Any:
    """The site's composites as an ONNX model over ``original``'s inputs and weights (its dtype),
    written by onnxsat's exporter: what extraction would emit had it chosen them.

    ``leaf_names``: site leaf -> the original model's tensor name."""
    from onnx import ModelProto

    from ...egraph.exporter import to_onnx
    from ...egraph.graph_types import ENode

    model = cast(ModelProto, original)
    weights = {t.name: t for t in model.graph.initializer}
    graph = term_graph(*site.composites)
    nodes = []
    for eclass, node in graph.nodes:
        if node.op == "Tensor.input":
            name = leaf_names[node.args[0]]
            node = ENode("Tensor.weight" if name in weights else "Tensor.input", (name,))
        nodes.append((eclass, node))
    graph.nodes = nodes
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    program = Program(
        egraph=cast(EGraph, None),
        model=model,
        opset=opset,
        outputs=[(o.name, L.Tensor.none()) for o in model.graph.output],
        names=[],
        weights=weights,
        opaque={},
        symbols={},
        true_inputs=[i.name for i in model.graph.input],
        overridable=set(),
    )
    return to_onnx(program, graph)
