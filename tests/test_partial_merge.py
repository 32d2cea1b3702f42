"""conv-pointwise-merge: a 1x1 Conv feeding a k x k Conv as one merged Conv plus PET's border
correction; proved into the e-graph, PET-verified (a wrong correction is caught), chosen by
extraction on a linear-bottleneck model and numerically equal to it on onnxruntime."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import onnxruntime as ort
import pytest
from egglog import eq, union

import onnxsat
from onnxsat import study
from onnxsat.egraph import lang as L
from onnxsat.egraph.shapes import shape_rules
from onnxsat.extract.serialized import serialize
from onnxsat.forced import Saturated
from onnxsat.rules.pet.partial import apply_partial_rules
from onnxsat.rules.pet.partial_merge import RULE, border_rows, merge_site, pair_sample
from onnxsat.rules.pet.partial_models import linear_bottleneck
from onnxsat.rules.pet.verify_partial import verify_site

from .prove import _egraph
from .test_rules_partial import _cat, _ints, _sl


def _conv(x: L.Tensor, w: L.Tensor, b: L.Tensor, pads: list[int]) -> L.Tensor:
    return L.conv(x, w, b, L.ivec([1, 1]), L.ivec(pads), L.ivec([1, 1]), 1)


def test_border_rows_are_the_windows_that_read_padding() -> None:
    from onnxsat.rules.pet.partial import Window

    assert border_rows(Window(3, 1, 1, 1), 6, 6) == [(0, 1), (5, 6)]
    assert border_rows(Window(5, 1, 2, 1), 7, 6) == [(0, 2), (5, 6)]
    assert border_rows(Window(3, 2, 1, 1), 8, 4) == [(0, 1)]  # the last window ends on the last row
    assert border_rows(Window(1, 1, 0, 0), 6, 6) == []


def test_wrong_corrections_are_caught() -> None:
    first, second = pair_sample(2, 4, 3, (6, 5), (3, 3), (1, 1, 1, 1))
    good = merge_site(first, second)
    assert good is not None
    verdict = verify_site(good)
    assert verdict.ok and verdict.differing_boxes > 0, verdict.detail  # a real correction
    # The composite leaves out the left column's correction: it differs from the original there.
    wrong = merge_site(first, second, skip_corrections=1)
    assert wrong is not None
    verdict = verify_site(wrong)
    assert not verdict.ok and "mutant + correction != original" in verdict.detail
    # The declared slabs miss the columns: the differing boxes lie outside them.
    good.corrections = [[s for s in good.corrections[0] if s[0] != 3]]
    verdict = verify_site(good)
    assert not verdict.ok and "outside the corrected regions" in verdict.detail


def test_without_the_first_bias_the_merge_is_exact() -> None:
    site = merge_site(*pair_sample(2, 4, 3, (6, 5), (3, 3), (1, 1, 1, 1), bias1=False))
    assert site is not None and site.corrections == [[]]
    verdict = verify_site(site)
    assert verdict.ok and verdict.differing_boxes == 0, verdict.detail


def test_prove_conv_pointwise_merge() -> None:
    x, w1, b1, w2 = L.Tensor.input("x"), L.Tensor.weight("w1"), L.Tensor.weight("b1"), L.Tensor.weight("w2")
    none = L.Tensor.none()

    def pair(t: L.Tensor, pads: list[int]) -> L.Tensor:
        return _conv(_conv(t, w1, b1, [0, 0, 0, 0]), w2, none, pads)

    start = pair(x, [1, 1, 1, 1])
    rows = L.reshape(L.transpose(w2, L.ivec([0, 2, 3, 1])), _ints([18, 3]), 0)
    weight = L.transpose(L.reshape(L.matmul(rows, L.reshape(w1, _ints([3, 2]), 0)), _ints([2, 3, 3, 2]), 0), L.ivec([0, 3, 1, 2]))
    taps = L.reduce_sum(w2, _ints([2, 3]), 0, 0)
    bias = L.reshape(L.matmul(taps, L.reshape(b1, _ints([3, 1]), 0)), _ints([2]), 0)
    merged = _conv(x, weight, bias, [1, 1, 1, 1])
    left, right = pair(_sl(x, 3, 0, 2), [1, 1, 1, 0]), pair(_sl(x, 3, 3, 5), [1, 0, 1, 1])
    columns = _cat([left, _sl(merged, 3, 1, 4), right], 3)
    top, bottom = pair(_sl(x, 2, 0, 2), [1, 1, 0, 1]), pair(_sl(x, 2, 2, 4), [0, 1, 1, 1])
    goal = _cat([top, _sl(columns, 2, 1, 3), bottom], 2)
    shapes = {"x": (1, 2, 4, 5), "w1": (3, 2, 1, 1), "b1": (3,), "w2": (2, 3, 3, 3)}
    with _egraph([start], shapes, ("w1", "b1", "w2"), {}) as eg:
        # every tensor of an imported graph has its ref (the pass reads op applications between refs)
        tensors = [x, w1, b1, w2, _conv(x, w1, b1, [0, 0, 0, 0]), start]
        eg.register(*[union(L.tensor_ref(i)).with_(t) for i, t in enumerate(tensors)])
        eg.run(shape_rules.saturate())
        # a tiny image: the border is most of it, so no correction limit here
        records = apply_partial_rules(SimpleNamespace(egraph=eg), serialize(eg), [RULE], max_correction=1.0)
        assert [r.status for r in records] == ["emitted"], records
        eg.check(eq(start).to(goal))


def test_linear_bottleneck_uses_the_merge_and_matches_onnxruntime() -> None:
    """On a small linear bottleneck the ort-cpu cost model picks the merged Conv with its correction;
    the result verifies and equals the original on onnxruntime. (At 16 x 16 the border corrections
    are a quarter of the image and, priced by the ops they use, cost more than the merge saves.)"""
    model = linear_bottleneck(channels=16, size=24)
    out, report = onnxsat.optimize(model, onnxsat.Options(rules_only=("core",), enable_rules=(RULE,)))
    assert report.verification.status == "passed"
    (record,) = report.partial
    assert record["status"] == "emitted" and record["used"] and record["differing_boxes"] > 0, record
    convs = [n for n in out.graph.node if n.op_type == "Conv"]
    assert len(convs) == 9  # the merged Conv and the pair on each of the four borders
    x = np.random.default_rng(3).standard_normal((1, 16, 24, 24)).astype(np.float32)
    want, got = (ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0] for m in (model, out))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    # the rule-effectiveness records list the site rule in its family, used by the program
    records = {r["rule"]: r for r in study.rule_records(study.Run("bottleneck", model, out, report))}
    assert records[RULE]["family"] == "partial" and records[RULE]["matches"] == 1 and records[RULE]["in_program"]


def test_pinned_extraction_and_extractor_study_see_site_rules() -> None:
    """``onnxsat.forced`` and ``study.extractor_records`` run the per-site stage before saturating,
    as ``optimize`` does: the merged Conv is in their e-graph and extraction picks it."""
    model = linear_bottleneck(channels=16, size=16)
    options = onnxsat.Options(rules_only=("core",), enable_rules=(RULE,))
    sat = Saturated.of(model, options)
    assert [(p.rule, p.status) for p in sat.partial] == [(RULE, "emitted")]
    out, graph = sat.extract()  # checked against the original on onnxruntime
    assert [n.op_type for n in out.graph.node].count("Conv") == 9
    (record,) = study.extractor_records("bottleneck", model, options, methods=("greedy-dag",))
    assert record["nodes"] == sum(1 for _, n in graph.nodes if not n.op.startswith(("Tensor.", "TList.")))
    assert record["cost"] == pytest.approx(graph.cost)
