"""Rules are declared once per process and rule set: later models reuse the e-graph under push/pop."""

from __future__ import annotations

import onnx

import onnxsat
from onnxsat.egraph import lang as L
from onnxsat.egraph.importer import import_symbols
from onnxsat.egraph.warm import DECLARED, warm_egraph
from onnxsat.rules.schedule import declarations, select_rules

from .models import EXAMPLES


def test_second_model_reuses_the_declared_rules_and_gives_the_same_bytes() -> None:
    model = onnx.load(str(EXAMPLES / "small_cnn.onnx"))
    options = onnxsat.Options(verify=False)
    key, _, _ = declarations(select_rules(), options.budgets, start=import_symbols(model))
    first, _ = onnxsat.optimize(model, options)
    declared = DECLARED[key]
    second, _ = onnxsat.optimize(model, options)
    assert DECLARED[key] == declared  # no new e-graph had the rules declared
    assert first.SerializeToString(deterministic=True) == second.SerializeToString(deterministic=True)


def test_a_nested_use_gets_its_own_egraph_and_each_use_starts_empty() -> None:
    key = ("test-warm-nested",)
    with warm_egraph(key, []) as outer:
        egraph = outer.fresh()
        egraph.register(L.Tensor.input("x"))
        with warm_egraph(key, []) as inner:
            assert inner.fresh() is not egraph
            assert sum(n for _, n in inner.fresh().all_function_sizes()) == 0
    assert DECLARED[key] == 2
    with warm_egraph(key, []) as again:
        assert sum(n for _, n in again.fresh().all_function_sizes()) == 0
    assert DECLARED[key] == 2


def test_only_the_most_recently_used_idle_egraphs_are_kept() -> None:
    from onnxsat.egraph import warm

    keys = [(f"test-warm-kept-{i}",) for i in range(warm.MAX_KEPT + 3)]
    for key in keys:
        with warm_egraph(key, []):
            pass
    kept = warm.idle()
    assert sum(kept.values()) <= warm.MAX_KEPT
    assert keys[-1] in kept and keys[0] not in kept
    with warm_egraph(keys[0], []):  # a forgotten rule set is declared again when it comes back
        pass
    assert DECLARED[keys[0]] == 2
