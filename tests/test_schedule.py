"""The schedule: named phases in the documented order, each stopped by a budget the report names,
``--rules-only``/``--disable-rules`` by rule or family name, and the phases in the CLI summary."""

from __future__ import annotations

import onnx
import pytest

import onnxsat
from onnxsat.base.options import Budgets
from onnxsat.egraph.importer import from_onnx
from onnxsat.rules import RULES
from onnxsat.rules.schedule import Phase, default_schedule, phase_rules, saturate, select_rules

from .helpers_onnx import warm_import
from .models import EXAMPLES


def _example(name: str) -> onnx.ModelProto:
    return onnx.load(str(EXAMPLES / name))


def test_default_schedule_order_and_family_coverage() -> None:
    budgets = Budgets(k_multi=2)
    phases = default_schedule(budgets, [*RULES.families, "my-plugin"])
    assert [p.name for p in phases] == [
        "algebra", "layout", "algebra", "layout", "partial", "plugin:my-plugin", "multi", "fusion"
    ]  # fmt: skip
    assert next(p for p in phases if p.name == "multi").iterations == 2
    # Every in-tree family runs in some phase (a new family needs a place in the schedule).
    scheduled = {f for p in default_schedule(budgets) for f in p.families}
    assert set(RULES.families) <= scheduled


def test_phase_rules_respect_the_enabled_list() -> None:
    enabled = select_rules(rules_only=("layout", "neg-neg"))
    algebra = phase_rules(Phase("algebra", ("core", "algebraic")), enabled)
    assert algebra == ["neg-neg"]
    layout = phase_rules(Phase("layout", ("layout",)), enabled)
    assert layout and all(RULES.family_of(n) == "layout" for n in layout)
    assert "transpose-sink-softmax" not in select_rules(disable=("transpose-sink-softmax",))
    with pytest.raises(ValueError, match="unknown rule or family"):
        select_rules(rules_only=("no-such-rule",))


def test_each_phase_reports_what_stopped_it() -> None:
    with warm_import(rules=True):
        program = from_onnx(_example("layout_algebra.onnx"))
    budgets = Budgets()
    schedule = [
        Phase("algebra", ("core", "algebraic"), iterations=1),
        Phase("layout", ("layout", "shape-arith")),
        Phase("fusion", ("fusion",), seconds=0.0),
    ]
    report = saturate(program, budgets, select_rules(), schedule=schedule)
    stops = {p.name: p.stop_reason for p in report.phases}
    assert stops["analysis"] == "saturated"
    assert stops["algebra"] in ("iterations", "saturated") and report.phases[1].iterations == 1
    assert stops["layout"] == "saturated"
    assert stops["fusion"] in ("seconds", "saturated")  # a phase's own time budget, not the global one
    assert report.phases[-1].iterations <= 1
    assert sum(p.iterations for p in report.phases) == len(report.iterations)
    assert all(it.phase == p.name for p in report.phases for it in report.iterations[p.first_iteration :][: p.iterations])


def test_global_enode_budget_ends_the_schedule() -> None:
    program = from_onnx(_example("layout_algebra.onnx"))
    report = saturate(program, Budgets(enodes=1), select_rules())
    assert report.stop_reason == "enodes"
    assert [p.name for p in report.phases] == ["analysis", "algebra"]


def test_report_and_summary_name_the_phases() -> None:
    model = _example("layout_algebra.onnx")
    _, report = onnxsat.optimize(model, onnxsat.Options(budgets=Budgets(iterations=3)))
    names = [p.name for p in report.saturation.phases]
    assert names[0] == "analysis" and "algebra" in names and "layout" in names
    assert "phases           analysis saturated" in report.render()
    assert report.to_dict()["saturation"]["phases"][0]["name"] == "analysis"


def test_no_rules_enabled() -> None:
    _, report = onnxsat.optimize(_example("small_cnn.onnx"), onnxsat.Options(rules_only=("neg-neg",), disable_rules=("neg-neg",)))
    assert report.saturation.stop_reason == "no rules enabled"
    assert [p.name for p in report.saturation.phases] == ["analysis"]
