"""The import's directly built egglog commands are the ones egglog's Python layer would send."""

from __future__ import annotations

from typing import Any

import pytest
from egglog import EGraph, set_, union
from egglog.egraph import _command_like

from onnxsat.egraph import lang as L
from onnxsat.egraph.commands import Commands, int_vec, lit_float, lit_int, lit_string
from onnxsat.egraph.ops import OPS

SAMPLE = {"int": 3, "float": -0.25, "string": "NOTSET", "ints": (1, -2, 5)}


def _python_layer(egraph: EGraph, action: Any) -> str:
    command = _command_like(action)
    egraph._add_decls(command)
    return str(egraph._command_to_egg(command))


def _literal(kind: str, value: Any) -> Any:
    return {"int": lit_int, "float": lit_float, "string": lit_string}.get(kind, int_vec)(value)


@pytest.mark.parametrize("op_type", sorted(OPS))
def test_every_op_term_matches_egglog(op_type: str) -> None:
    spec = OPS[op_type]
    egraph = EGraph()
    commands = Commands(egraph)
    n_inputs = 1 if spec.variadic else len(spec.inputs)
    refs = [L.tensor_ref(i + 1) for i in range(n_inputs)]
    direct_refs = [commands.call(L.tensor_ref, lit_int(i + 1)) for i in range(n_inputs)]
    if spec.variadic:
        refs = [L.tlist([L.tensor_ref(1), L.tensor_ref(2)])]
        direct_refs = [commands.call(L.TList.cons, commands.call(L.tensor_ref, lit_int(1)),
                                     commands.call(L.TList.cons, commands.call(L.tensor_ref, lit_int(2)),
                                                   commands.call(L.TList.nil)))]
    values = [SAMPLE[a.kind] for a in spec.attrs]
    high = [L.ivec(v) if a.kind == "ints" else v for a, v in zip(spec.attrs, values, strict=True)]
    direct = [_literal(a.kind, v) for a, v in zip(spec.attrs, values, strict=True)]
    if spec.indexed_outputs:
        high.append(1)
        direct.append(lit_int(1))
    expected = _python_layer(egraph, union(L.tensor_ref(0)).with_(spec.ctor(*refs, *high)))
    commands.union(commands.call(L.tensor_ref, lit_int(0)), commands.call(spec.ctor, *direct_refs, *direct))
    assert str(commands.queue[0]) == expected


def test_leaves_analyses_and_lookup() -> None:
    egraph = EGraph()
    commands = Commands(egraph)
    cases = [
        (union(L.tensor_ref(0)).with_(L.Tensor.splat(1.5, L.ivec([2, 3]), 1)),
         lambda: commands.union(commands.call(L.tensor_ref, lit_int(0)),
                                commands.call(L.Tensor.splat, lit_float(1.5), int_vec([2, 3]), lit_int(1)))),
        (union(L.tensor_ref(1)).with_(L.Tensor.ints(L.ivec([]), 1)),
         lambda: commands.union(commands.call(L.tensor_ref, lit_int(1)),
                                commands.call(L.Tensor.ints, int_vec([]), lit_int(1)))),
        (set_(L.shape(L.tensor_ref(0))).to(L.ivec([2, 3])),
         lambda: commands.set(L.shape, [commands.call(L.tensor_ref, lit_int(0))], int_vec([2, 3]))),
        (set_(L.model_opset()).to(17), lambda: commands.set(L.model_opset, [], lit_int(17))),
    ]
    for action, build in cases:
        expected = _python_layer(egraph, action)
        build()
        assert str(commands.queue[-1]) == expected
    commands.fact(L.small_const, commands.call(L.Tensor.weight, lit_string("w")))
    commands.send()
    assert not commands.queue
    ref0 = commands.call(L.tensor_ref, lit_int(0))
    assert commands.lookup(L.shape, ref0) is not None
    assert commands.lookup(L.shape, commands.call(L.tensor_ref, lit_int(1))) is None
    assert egraph.extract(L.shape(L.tensor_ref(0))) == L.ivec([2, 3])
    egraph.check(L.small_const(L.Tensor.weight("w")))


def _python_layer_round(batch: list[Any]) -> list[Any]:
    """A verification round's actions through egglog's Python layer (what ``_queue_round`` replaced)."""
    from onnxsat.rules.verification.rule_instances import to_egglog
    from onnxsat.rules.verification.verify import _model_opset

    memo: dict[int, Any] = {}
    actions: list[Any] = [set_(L.model_opset()).to(_model_opset(batch[0].pattern))]
    outputs = 0
    for index, inst in enumerate(batch):
        leaves = {}
        for leaf in inst.leaves.values():
            node = leaves[leaf.name] = (L.Tensor.weight if leaf.weight else L.Tensor.input)(leaf.name)
            actions += [set_(L.shape(node)).to(L.ivec(list(leaf.shape))), set_(L.dtype(node)).to(leaf.dtype)]
            if leaf.weight:
                actions.append(L.small_const(node))
        actions += [union(L.tensor_ref(index * 64 + k)).with_(leaves[n]) for k, n in enumerate(inst.marker_leaves())]
        for root in inst.roots:
            actions.append(union(L.graph_output(outputs)).with_(to_egglog(root, memo)))
            outputs += 1
    return actions


def test_verification_rounds_match_egglog() -> None:
    """Rule verification's rounds (``_queue_round``) send the commands egglog's Python layer would,
    and ``round_symbols`` names exactly the tables they fill."""
    import numpy as np

    from onnxsat.egraph.reach import present_symbols
    from onnxsat.rules import RULES
    from onnxsat.rules.verification.rule_instances import Instance
    from onnxsat.rules.verification.rule_pattern import RulePattern, parse_rule
    from onnxsat.rules.verification.verify import _queue_round, round_symbols

    rng = np.random.default_rng(0)
    kinds: set[str] = set()

    def patterns(name: str) -> list[RulePattern]:
        return [parse_rule(*rule) for rule in RULES.egg_rules[name]]

    marked = next(name for name in RULES.names() if any(p.markers for p in patterns(name)))  # reads import order
    for name in [*RULES.names()[::12], marked]:
        for pattern in patterns(name):
            batch = []
            for tag in range(4):
                try:
                    batch.append(Instance(pattern, rng, tag))
                except Exception:  # an invalid candidate, as the verifier discards it
                    continue
            if not batch:
                continue
            egraph, reference = EGraph(), EGraph()
            actions = _python_layer_round(batch)
            expected = [_python_layer(reference, action) for action in actions]  # "None": a fact (sent as a let)
            reference.register(*actions)
            commands = Commands(egraph)
            _queue_round(commands, batch, {})
            fact = f"({commands.name(L.small_const)} "
            for sent, want in zip([str(c) for c in commands.queue], expected, strict=True):
                assert sent.startswith(fact) if want == "None" else sent == want, name
            commands.send()
            assert round_symbols(batch) == present_symbols(egraph) == present_symbols(reference), name
            sizes = {str(fn): n for fn, n in egraph.all_function_sizes() if n}
            assert sizes == {str(fn): n for fn, n in reference.all_function_sizes() if n}, name
            kinds.update(c.split(" ")[0] for c in expected)
            kinds.update("weight" for inst in batch if any(x.weight for x in inst.leaves.values()))
            kinds.update("marker" for inst in batch if inst.marker_leaves())
    assert {"weight", "marker"} <= kinds
