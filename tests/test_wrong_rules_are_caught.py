"""Deliberately wrong rules never reach the output: the run is repeated without them (the report
names them), and a model is refused only when even the run without rewrites fails verification."""

from __future__ import annotations

from collections.abc import Iterator

import onnx
import pytest
from egglog import Vec, i64, vars_

import onnxsat
from onnxsat import pipeline
from onnxsat.base.errors import VerificationError
from onnxsat.egraph import lang as L
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
def test_shape_unsound_rule_is_named_and_left_out(bad_rule: str) -> None:
    """The run is repeated without the rule; the verified result is written with a warning."""
    model = onnx.load(str(EXAMPLES / "layout_algebra.onnx"))
    optimized, report = onnxsat.optimize(model, onnxsat.Options())
    assert list(report.dropped_rules) == [bad_rule]
    assert "unsound" in report.dropped_rules[bad_rule]
    assert any(bad_rule in w for w in report.warnings)
    assert report.verification.status == "passed"
    assert report.saturation.rule_matches().get(bad_rule, 0) == 0
    onnx.checker.check_model(optimized, full_check=True)


@pytest.mark.parametrize("bad_rule", ["bad-relu-is-identity"], indirect=True)
@pytest.mark.parametrize("model_file", ["small_cnn.onnx", "custom_op.onnx"])
def test_numerically_wrong_rule_is_caught_and_left_out(bad_rule: str, model_file: str) -> None:
    """Also when onnxruntime cannot run the model whole (custom op: region-wise check)."""
    model = onnx.load(str(EXAMPLES / model_file))
    _, report = onnxsat.optimize(model, onnxsat.Options(minimize_seconds=120))
    # Minimization names the rule alone when its time budget allows (on a loaded machine it may
    # stop early and name more; they are dropped together and the result is still verified).
    assert bad_rule in report.dropped_rules
    assert "verification failed" in report.dropped_rules[bad_rule]
    assert report.saturation.rule_matches().get(bad_rule, 0) == 0
    assert report.verification.status in ("passed", "regionwise")


@pytest.mark.parametrize("bad_rule", ["bad-relu-is-identity"], indirect=True)
def test_no_retries_left_means_a_run_without_rewrites(bad_rule: str) -> None:
    model = onnx.load(str(EXAMPLES / "small_cnn.onnx"))
    _, report = onnxsat.optimize(model, onnxsat.Options(rule_retries=0, minimize_seconds=60))
    assert bad_rule in report.dropped_rules
    assert report.saturation.rule_matches() == {}  # the accepted run rewrote nothing
    assert report.verification.status == "passed"


def test_refused_only_when_the_run_without_rewrites_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """Exit 3 remains for a model whose unrewritten export cannot be verified; the retries are bounded."""
    calls: list[int] = []

    def always_fails(original, optimized, options, enabled, reference=None):  # type: ignore[no-untyped-def]
        calls.append(len(enabled))
        raise VerificationError("y", 1.0, "outputs differ")

    monkeypatch.setattr(pipeline, "_verify", always_fails)
    model = onnx.load(str(EXAMPLES / "small_cnn.onnx"))
    with pytest.raises(VerificationError) as info:
        onnxsat.optimize(model, onnxsat.Options(rule_retries=3))
    assert info.value.exit_code == 3
    assert len(calls) == 2 and calls[-1] == 0  # no culprit named: every rule dropped at once, then refused
