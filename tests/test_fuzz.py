"""Differential fuzzing: ``onnxsat.optimize`` on random valid graphs computes what they compute.

The graphs come from ``tests/fuzzing`` (strategy ``fuzz_models``: the modelled ops with small
shapes, broadcasting, shared tensors, weights, several outputs, and the op chains the rules
match). Each example is optimized with the full rule library and one extractor (drawn per
example, so every extractor gets its share) and must keep its inputs/outputs and match the
original on onnxruntime (``fuzzing.check.check_case``).

CI profile: derandomized (the same examples every run), no deadline, 200 examples in all, split
over four tests so pytest-xdist spreads them. Thousands, with a random seed and minimized
failures: ``python benchmarks/fuzz.py``. Failures found so far are in test_fuzz_regressions.py.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .fuzzing.check import EXTRACTORS, check_case, validate
from .fuzzing.strategy import fuzz_models

CI = settings(
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
EXAMPLES_PER_TEST = 50


@settings(CI, max_examples=200)
@given(fuzz_models())
def test_generator_makes_valid_models(case) -> None:  # type: ignore[no-untyped-def]
    """Every generated model passes the checker and runs on onnxruntime with the output shapes
    and dtypes the generator tracked (cheap: no optimize; keeps the fuzz tests' discards at 0)."""
    reason = validate(case)
    assert reason is None, reason


def _fuzz(case, extractor: str) -> None:  # type: ignore[no-untyped-def]
    reason = validate(case)
    assert reason is None, f"generator mistake: {reason}"
    problems, _ = check_case(case, extractor)
    assert not problems, f"[{extractor}] " + "\n".join(problems)


# Four tests, not one: hypothesis derandomizes by test name, so each draws its own examples, and
# pytest-xdist can run them on different workers.
@settings(CI, max_examples=EXAMPLES_PER_TEST)
@given(fuzz_models(), st.sampled_from(EXTRACTORS))
def test_fuzz_optimize_a(case, extractor: str) -> None:  # type: ignore[no-untyped-def]
    _fuzz(case, extractor)


@pytest.mark.slow
@settings(CI, max_examples=EXAMPLES_PER_TEST)
@given(fuzz_models(), st.sampled_from(EXTRACTORS))
def test_fuzz_optimize_b(case, extractor: str) -> None:  # type: ignore[no-untyped-def]
    _fuzz(case, extractor)


@pytest.mark.slow
@settings(CI, max_examples=EXAMPLES_PER_TEST)
@given(fuzz_models(), st.sampled_from(EXTRACTORS))
def test_fuzz_optimize_c(case, extractor: str) -> None:  # type: ignore[no-untyped-def]
    _fuzz(case, extractor)


@pytest.mark.slow
@settings(CI, max_examples=EXAMPLES_PER_TEST)
@given(fuzz_models(), st.sampled_from(EXTRACTORS))
def test_fuzz_optimize_d(case, extractor: str) -> None:  # type: ignore[no-untyped-def]
    _fuzz(case, extractor)
