"""Only the rules that can fire on a model are declared, and that changes no result."""

from __future__ import annotations

import onnx
import pytest
from egglog import EGraph, rule, union

import onnxsat
from onnxsat import pipeline
from onnxsat.egraph import lang as L
from onnxsat.egraph.importer import from_onnx, import_symbols
from onnxsat.egraph.reach import EVERYTHING, closure, present_symbols, reach_of, symbol
from onnxsat.egraph.shapes import analysis_rules
from onnxsat.rules.registry import RuleTable
from onnxsat.rules.schedule import select, select_rules, widen

from .models import EXAMPLES


def _name(ctor: object) -> str:
    name = symbol(ctor.__egg_decls__, ctor.__egg_ref__)  # type: ignore[attr-defined]
    assert name is not None
    return name


def test_a_rule_needs_the_tables_its_body_reads_and_creates_those_its_head_writes() -> None:
    from egglog import vars_

    a, b, root = vars_("a b root", L.Tensor)
    built = rule(root == L.mul(a, b), L.is_const(b)).then(union(root).with_(L.neg(L.relu(a))))
    reach = reach_of(built)
    assert reach.needs == {_name(L.mul), _name(L.is_const)}
    assert reach.creates == {_name(L.neg), _name(L.relu)}


def test_closure_follows_what_chosen_rules_create_and_leaves_out_the_rest() -> None:
    from onnxsat.egraph.reach import Reach

    rules = [
        Reach(frozenset({"conv"}), frozenset({"pad"})),  # fires: conv is there
        Reach(frozenset({"pad", "relu"}), frozenset({"slice"})),  # fires: pad comes from the first
        Reach(frozenset({"matmul"}), frozenset({"gemm"})),  # never: nothing makes a matmul
        Reach(frozenset({"gemm"}), frozenset({"relu"})),  # never: gemm only from the one above
        Reach(frozenset(), frozenset({EVERYTHING})),  # an unread rule: it may write anything
    ]
    chosen, available = closure({"conv", "relu"}, rules[:4])
    assert chosen == [0, 1] and available == {"conv", "relu", "pad", "slice"}
    chosen, _ = closure({"conv"}, rules)
    assert chosen == [0, 1, 2, 3, 4]  # after a rule that may write anything, every rule may fire


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.onnx")), ids=lambda p: p.stem)
def test_the_import_fills_no_table_its_selection_leaves_out(path: object) -> None:
    model = onnx.load(str(path))
    selection = select(select_rules(), RuleTable.default(), import_symbols(model))
    assert selection is not None
    assert present_symbols(from_onnx(model).egraph) <= selection.available
    with pipeline.Session(model, onnxsat.Options(verify=False)) as session:
        assert session.load().selection is not None  # the import kept to its selection (no fallback)


def test_a_small_model_declares_a_fraction_of_the_rules() -> None:
    model = onnx.load(str(EXAMPLES / "small_cnn.onnx"))
    table = RuleTable.default()
    enabled = select_rules()
    selection = select(enabled, table, import_symbols(model))
    assert selection is not None and selection.rewrites is not None
    every = sum(len(table.egg_rules[n]) for n in enabled)
    assert 0 < len(selection.rewrites) < every
    declared = selection.analysis.__egg_ruleset__.rules  # type: ignore[attr-defined]
    assert 0 < len(declared) < len(analysis_rules())


def test_widen_adds_the_rules_of_a_table_written_after_import() -> None:
    model = onnx.load(str(EXAMPLES / "small_cnn.onnx"))  # nothing in it or its rules makes an Erf
    table = RuleTable.default()
    enabled = select_rules()
    program = from_onnx(model)
    program.selection = before = select(enabled, table, import_symbols(model))
    assert before is not None and _name(L.erf) not in before.available
    program.egraph.register(L.erf(L.Tensor.input("p")))
    widen(program, enabled, table)
    assert _name(L.erf) in program.selection.available
    assert len(program.selection.analysis.__egg_ruleset__.rules) > len(before.analysis.__egg_ruleset__.rules)


def test_the_selected_rules_give_the_bytes_every_rule_gives(monkeypatch: pytest.MonkeyPatch) -> None:
    model = onnx.load(str(EXAMPLES / "linear_bottleneck.onnx"))
    options = onnxsat.Options(verify=False)
    selected, _ = onnxsat.optimize(model, options)
    monkeypatch.setattr(pipeline, "import_symbols", lambda _model: None)  # declare every rule
    every, _ = onnxsat.optimize(model, options)
    assert selected.SerializeToString(deterministic=True) == every.SerializeToString(deterministic=True)


def test_an_egraph_with_nothing_in_it_has_no_present_tables() -> None:
    assert present_symbols(EGraph()) == frozenset()


def test_an_idle_egraph_whose_rules_cover_the_model_is_reused_with_the_same_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from onnxsat.egraph import warm
    from onnxsat.rules.schedule import declarations

    options = onnxsat.Options(verify=False)
    larger = onnx.load(str(EXAMPLES / "small_cnn.onnx"))
    smaller = onnx.load(str(EXAMPLES / "linear_bottleneck.onnx"))  # its closure lies inside small_cnn's
    key, _, _ = declarations(select_rules(), options.budgets, start=import_symbols(smaller))
    warm.forget()
    onnxsat.optimize(larger, options)
    declared = warm.DECLARED.get(key, 0)
    reused, _ = onnxsat.optimize(smaller, options)
    assert warm.DECLARED.get(key, 0) == declared  # small_cnn's e-graph served it
    monkeypatch.setattr(pipeline, "import_symbols", lambda _model: None)  # every rule
    every, _ = onnxsat.optimize(smaller, options)
    assert reused.SerializeToString(deterministic=True) == every.SerializeToString(deterministic=True)


def test_what_export_writes_is_in_the_symbols_a_region_wise_run_declares() -> None:
    """A window imports the ConstantOfShape and Identity nodes export writes between regions; their
    tables are what ``written_symbols`` adds to the whole graph's, so windows share the regions'
    declared e-graph instead of declaring another."""
    from onnx import TensorProto, helper

    from onnxsat.egraph.importer import written_symbols

    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("ConstantOfShape", ["s"], ["zeros"]),
        helper.make_node("Identity", ["zeros"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "written", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    shape_only = helper.make_model(
        helper.make_graph([nodes[0]], "s", list(graph.input), [helper.make_tensor_value_info("s", TensorProto.INT64, [2])]),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    assert written_symbols() <= import_symbols(model)
    assert not written_symbols() <= import_symbols(shape_only)
