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
