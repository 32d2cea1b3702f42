"""ConvTranspose as a sub-pixel convolution (rules/pet/partial_subpixel.py), an exact site rule on by
default: the numpy ConvTranspose PET's check evaluates with, a wrong phase kernel caught, the prove
test, the default selection, and a decoder optimized with it."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from egglog import eq, union
from onnx import helper

import onnxsat
from onnxsat.egraph import lang as L
from onnxsat.egraph.shapes import shape_rules
from onnxsat.extract.serialized import serialize
from onnxsat.rules import RULES
from onnxsat.rules.pet import partial_subpixel
from onnxsat.rules.pet.partial import apply_partial_rules
from onnxsat.rules.pet.partial_models import decoder_block, site_model
from onnxsat.rules.pet.partial_subpixel import RULE, conv_transpose_sample, subpixel_site
from onnxsat.rules.pet.verify_partial import conv_transpose_reference, verify_site
from onnxsat.rules.schedule import select_rules
from onnxsat.rules.verification.rule_pattern import describe_rule

from .prove import _egraph

CT_CASES = [
    ((1, 3, 5, 4), (3, 2, 4, 4), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((2, 2, 4, 5), (2, 3, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]}),
    ((1, 4, 4, 3), (4, 1, 3, 2), {"strides": [3, 2], "pads": [0, 1, 2, 0], "dilations": [2, 1], "group": 2}),
]


@pytest.mark.parametrize(("x_shape", "w_shape", "attrs"), CT_CASES)
def test_numpy_conv_transpose_matches_onnxruntime(x_shape: tuple[int, ...], w_shape: tuple[int, ...], attrs: dict[str, Any]) -> None:
    """The ConvTranspose PET's check evaluates with (onnx.reference's loops in Python) agrees with onnxruntime."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal(x_shape).astype(np.float32)
    group = attrs.get("group", 1)
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], kernel_shape=list(w_shape[2:]), **attrs)
    model = site_model([node], {"x": list(x_shape)}, {"y": None}, {"w": w_shape, "b": (w_shape[1] * group,)})
    weights = {t.name: np.frombuffer(t.raw_data, np.float32).reshape(t.dims) for t in model.graph.initializer}
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    got = conv_transpose_reference(
        x.astype(np.float64), weights["w"].astype(np.float64), weights["b"].astype(np.float64), attrs["strides"],
        attrs["pads"], attrs.get("dilations"), group, attrs.get("output_padding"),
    )
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=1e-5, atol=1e-5)


def test_flipped_phase_kernel_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The classic transposed-conv mistake (taps in kernel order, not flipped) differs almost everywhere."""
    call = conv_transpose_sample(1, 3, (5, 4), 2, (4, 4), (2, 2), (1, 1, 1, 1))
    good = subpixel_site(call)
    assert good is not None
    verdict = verify_site(good)
    assert verdict.ok and verdict.differing_boxes == 0 and verdict.boxes == 80, verdict
    right = partial_subpixel.phase_indices

    def unflipped(h: Any, w: Any) -> list[int]:
        per_phase = h.taps * w.taps
        indices = right(h, w)
        return [i for p in range(0, len(indices), per_phase) for i in reversed(indices[p : p + per_phase])]

    monkeypatch.setattr(partial_subpixel, "phase_indices", unflipped)
    wrong = subpixel_site(call)
    assert wrong is not None
    verdict = verify_site(wrong)
    assert not verdict.ok and "outside the corrected regions" in verdict.detail, verdict.detail


def _ints(values: list[int]) -> L.Tensor:
    return L.Tensor.ints(L.ivec(values), 1)


def test_prove_conv_transpose_subpixel() -> None:
    """kernel 4, stride 2, pads 1: output row o = 2q + b - 1 reads input rows q - 1 and q with kernel
    rows 2 + b and b (phase b), so one 2 x 2 Conv (pads 1) over 4 phase kernels, interleaved, sliced."""
    x, w, b = L.Tensor.input("x"), L.Tensor.weight("w"), L.Tensor.weight("b")
    start = L.conv_transpose(x, w, b, L.ivec([2, 2]), L.ivec([1, 1, 1, 1]), L.ivec([1, 1]), 1, L.ivec([0, 0]))
    taps = [(2 * (1 - th) + bh) * 4 + 2 * (1 - tw) + bw for bh in (0, 1) for bw in (0, 1) for th in (0, 1) for tw in (0, 1)]
    flat = L.pad(L.reshape(w, _ints([2, 3, 16]), 0), _ints([0, 0, 0, 0, 0, 1]), L.Tensor.none(), L.Tensor.none(), "constant")
    blocks = L.reshape(L.gather(flat, _ints(taps), 2), _ints([2, 3, 4, 2, 2]), 0)
    kernel = L.reshape(L.transpose(blocks, L.ivec([2, 1, 0, 3, 4])), _ints([12, 2, 2, 2]), 0)
    bias = L.concat(L.tlist([b, b, b, b]), 0)
    y = L.conv(x, kernel, bias, L.ivec([1, 1]), L.ivec([1, 1, 1, 1]), L.ivec([1, 1]), 1)  # [1, 12, 4, 5]
    cols = L.transpose(L.reshape(y, _ints([2, 2, 12, 5]), 0), L.ivec([0, 2, 3, 1]))
    rows = L.transpose(L.reshape(cols, _ints([1, 2, 3, 4, 10]), 0), L.ivec([0, 2, 3, 1, 4]))
    goal = L.slice_(L.reshape(rows, _ints([1, 3, 8, 10]), 0), _ints([1, 1]), _ints([7, 9]), _ints([2, 3]), L.Tensor.none())
    leaves = {"x": (1, 2, 3, 4), "w": (2, 3, 4, 4), "b": (3,)}
    with _egraph([start], leaves, ("w", "b"), {}) as eg:
        refs = [union(L.tensor_ref(i)).with_((L.Tensor.input if n == "x" else L.Tensor.weight)(n)) for i, n in enumerate(leaves)]
        eg.register(*refs, union(L.tensor_ref(len(leaves))).with_(start))
        eg.run(shape_rules.saturate())
        records = apply_partial_rules(SimpleNamespace(egraph=eg), serialize(eg), [RULE])
        assert [r.status for r in records] == ["emitted"], records
        eg.check(eq(start).to(goal))


def test_on_by_default_as_an_exact_rule() -> None:
    """Listed in the default-on layout family as an exact site rule (the partial family stays opt-in;
    test_rules_partial checks a model without ConvTranspose gets no per-site pass)."""
    assert RULE in select_rules() and RULES.family_of(RULE) == "layout" and "exact" in RULES.custom[RULE][1]
    assert describe_rule(RULES, RULE)["variants"][0]["note"].startswith("exact site rule")


def test_decoder_uses_subpixel_and_matches_onnxruntime() -> None:
    """A decoder's stride-2 ConvTransposes with the default rule selection (all but the core rules
    disabled, to keep saturation short): PET-verified, chosen by the built-in cost model (ORT's col2im
    pass priced), exported as Conv + transposes, numerically the original on onnxruntime."""
    model = decoder_block(channels=16, size=16)
    others = tuple(n for n in select_rules() if RULES.family_of(n) != "core" and n != RULE)
    out, report = onnxsat.optimize(model, onnxsat.Options(disable_rules=others))
    assert report.verification.status == "passed"
    records = [p for p in report.partial if p["rule"] == RULE]
    assert len(records) == 2 and all(p["status"] == "emitted" and p["differing_boxes"] == 0 for p in records), records
    assert all(p["used"] for p in records), records
    ops = [n.op_type for n in out.graph.node]
    assert "ConvTranspose" not in ops and ops.count("Conv") == 3, ops
    x = np.random.default_rng(2).standard_normal((1, 16, 16, 16)).astype(np.float32)
    want, got = (ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0] for m in (model, out))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
