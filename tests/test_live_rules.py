"""A run declares a rule once its tables hold rows (``egraph.live``), and that changes no result."""

from __future__ import annotations

import onnx
import pytest

import onnxsat
from onnxsat.egraph import live, warm
from onnxsat.egraph.importer import import_symbols
from onnxsat.egraph.reach import reach_cached
from onnxsat.rules import schedule
from onnxsat.rules.registry import RuleTable
from onnxsat.rules.schedule import live_rewrites, schedule_rulesets, select, select_rules

from .models import EXAMPLES


def _rules_of(ruleset: object) -> list[object]:
    decls = ruleset.__egg_decls__  # type: ignore[attr-defined]
    found = decls._rulesets[ruleset.__egg_ident__]  # type: ignore[attr-defined]
    parts = getattr(found, "rulesets", None)
    if parts is None:
        return list(found.rules)
    return [rule for part in parts for rule in decls._rulesets[part].rules]


def test_the_live_rules_are_those_whose_tables_hold_rows_in_the_selections_order() -> None:
    model = onnx.load(str(EXAMPLES / "small_cnn.onnx"))
    table, enabled = RuleTable.default(), select_rules()
    start = import_symbols(model)
    selection = select(enabled, table, start)
    assert selection is not None and selection.rewrites is not None
    names = max(schedule_rulesets(enabled, onnxsat.Options().budgets, table), key=len)
    every = [b for name in sorted(names) for _, b in table.egg_rules[name] if id(b) in selection.rewrites]
    chosen = _rules_of(live_rewrites(names, table, selection.rewrites, start))
    can = [b for b in every if reach_cached(b).needs <= start]
    assert 0 < len(can) <= len(chosen) < len(every)  # whole blocks: a few that cannot match come along
    assert {id(b.decl) for b in can} <= {id(d) for d in chosen}
    order = {id(b.decl): i for i, b in enumerate(every)}
    positions = [order[id(d)] for d in chosen]
    assert positions == sorted(positions)  # the selection's order, so matches apply in the same order
    grown = _rules_of(live_rewrites(names, table, selection.rewrites, selection.available))
    assert len(grown) == len(every)  # every table filled: the whole selection


@pytest.mark.parametrize("name", ["small_cnn.onnx", "layout_algebra.onnx"])
def test_declaring_rules_as_they_can_match_gives_the_bytes_of_declaring_the_selection(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = onnx.load(str(EXAMPLES / name))
    options = onnxsat.Options(verify=False)
    warm.forget()
    lazily, _ = onnxsat.optimize(model, options)
    warm.forget()

    def whole_analysis(rules: object, _present: object) -> object:
        from onnxsat.egraph.shapes import analysis_ruleset

        return analysis_ruleset(list(rules))  # type: ignore[call-overload]

    def whole_rewrites(names: list[str], table: RuleTable, only: object, _present: object) -> object:
        return table.ruleset_for(names, only)  # type: ignore[arg-type]

    monkeypatch.setattr(live, "live_analysis", whole_analysis)
    monkeypatch.setattr(schedule, "live_analysis", whole_analysis)
    monkeypatch.setattr("onnxsat.egraph.importer.live_analysis", whole_analysis)
    monkeypatch.setattr(schedule, "live_rewrites", whole_rewrites)
    at_once, _ = onnxsat.optimize(model, options)
    warm.forget()
    assert lazily.SerializeToString(deterministic=True) == at_once.SerializeToString(deterministic=True)
