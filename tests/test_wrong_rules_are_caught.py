"""Deliberately wrong rules never produce an output model; the error names the rule."""

from __future__ import annotations

from collections.abc import Iterator

import onnx
import pytest
from egglog import Vec, i64, vars_

import onnxsat
from onnxsat.base.errors import VerificationError
from onnxsat.egraph import lang as L
from onnxsat.pipeline import UnsoundRewriteError
from onnxsat.rules.registry import RULES, rewrite_rule

from .models import EXAMPLES

(x,) = vars_("x", L.Tensor)


@pytest.fixture
def bad_rule(request: pytest.FixtureRequest) -> Iterator[str]:
    name = request.param
    if name == "bad-drop-transpose":
        (p,) = vars_("p", Vec[i64])
        # Wrong: a non-identity transpose is not its input (shapes differ -> analysis conflict).
        rewrite_rule(RULES, "test-bad", name, L.transpose(x, p), x)
    else:
        # Wrong: Relu(x) is not x (same shape, so only numerics can tell).
        rewrite_rule(RULES, "test-bad", name, L.relu(x), x)
    yield name
    RULES.remove(name)
    RULES.families.pop("test-bad", None)


@pytest.mark.parametrize("bad_rule", ["bad-drop-transpose"], indirect=True)
def test_shape_unsound_rule_is_named(bad_rule: str) -> None:
    model = onnx.load(str(EXAMPLES / "layout_algebra.onnx"))
    with pytest.raises(UnsoundRewriteError) as info:
        onnxsat.optimize(model, onnxsat.Options())
    assert info.value.rules == [bad_rule]
    assert info.value.exit_code == 3


@pytest.mark.parametrize("bad_rule", ["bad-relu-is-identity"], indirect=True)
@pytest.mark.parametrize("model_file", ["small_cnn.onnx", "custom_op.onnx"])
def test_numerically_wrong_rule_is_caught_by_verification(bad_rule: str, model_file: str) -> None:
    """Also when onnxruntime cannot run the model whole (custom op: region-wise check)."""
    model = onnx.load(str(EXAMPLES / model_file))
    with pytest.raises(VerificationError) as info:
        onnxsat.optimize(model, onnxsat.Options(minimize_seconds=120))
    assert info.value.culprit_rules == [bad_rule]
    assert info.value.exit_code == 3
