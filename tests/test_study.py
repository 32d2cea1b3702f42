"""``onnxsat.study``: records per iteration and per rule agree with the report; ablation and extractors."""

from __future__ import annotations

import onnx
import pytest

import onnxsat
from onnxsat import study
from onnxsat.rules.schedule import default_schedule

from .models import EXAMPLES

OPTIONS = onnxsat.Options(
    budgets=onnxsat.Budgets(iterations=3, seconds=10.0), rules_only=("core", "algebraic")
)


@pytest.fixture(scope="module")
def layout_run() -> study.Run:
    return study.run("layout_algebra", onnx.load(str(EXAMPLES / "layout_algebra.onnx")), OPTIONS)


def test_iteration_and_rule_records_match_the_report(layout_run: study.Run) -> None:
    report = layout_run.report
    iterations = study.iteration_records(layout_run)
    assert [r["enodes"] for r in iterations] == [it.enodes for it in report.saturation.iterations]
    phases = {"analysis"} | {p.name for p in default_schedule(OPTIONS.budgets)}
    assert all(r["phase"] in phases and r["model"] == "layout_algebra" for r in iterations)
    assert iterations[-1]["enodes"] == report.saturation.enodes_after
    rules = study.rule_records(layout_run)
    assert {r["rule"]: r["matches"] for r in rules} == {
        k: v for k, v in report.saturation.rule_matches().items() if v
    }
    assert all(r["source"] == "in-tree" and r["family"] in ("core", "algebraic") for r in rules)
    by_rule = {r["rule"]: r for r in rules}
    # The model's MatMul+Add became a Gemm, so the rule that builds Gemm shows in the program;
    # relu-relu rewrites to a Relu the original already had more of, so it does not.
    assert [n.op_type for n in layout_run.optimized.graph.node].count("Gemm") == 1
    assert by_rule["matmul-add-to-gemm"]["in_program"] is True
    assert by_rule["relu-relu"]["in_program"] is False
    assert study.summary(rules, "family", "matches") == {
        f: float(sum(r["matches"] for r in rules if r["family"] == f))
        for f in ("core", "algebraic")
        if any(r["family"] == f for r in rules)
    }


def test_ablation_attributes_the_cost_reduction_to_a_family() -> None:
    model = onnx.load(str(EXAMPLES / "layout_algebra.onnx"))
    records = study.ablation(
        "layout_algebra", model, OPTIONS, families=["core"], latency_rounds=3, calls_per_round=2
    )
    baseline, without_core = records
    assert baseline["disabled"] == "(none)" and baseline["cost_increase"] == 1.0
    assert baseline["cost_after"] < baseline["cost_before"]
    assert without_core["disabled"] == "core"
    assert without_core["cost_after"] > baseline["cost_after"]  # the folds and eliminations are core rules
    assert without_core["cost_increase"] == pytest.approx(without_core["cost_after"] / baseline["cost_after"])
    low, high = without_core["latency_ci"]
    assert low <= without_core["latency_ratio"] <= high and without_core["latency_ms"] > 0
