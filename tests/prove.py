"""egg-style prove tests: a start term reaches a goal term under the rules and fixed budgets."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import onnx
import pytest
from egglog import EGraph, eq, i64, set_, union
from onnx import TensorProto, helper

import onnxsat
from onnxsat.base.report import Report
from onnxsat.egraph import lang as L
from onnxsat.egraph.shapes import shape_rules
from onnxsat.rules import RULES

F = TensorProto.FLOAT


@functools.cache
def _warm() -> EGraph:
    """One e-graph with every rule already registered (registering them costs seconds)."""
    egraph = EGraph()
    _run(egraph, 1)
    return egraph


@contextmanager
def _egraph(
    terms: list[L.Tensor], shapes: dict[str, tuple[int, ...]], consts: tuple[str, ...], dtypes: dict[str, int]
) -> Iterator[EGraph]:
    egraph = _warm()
    egraph.push()
    try:
        yield _load(egraph, terms, shapes, consts, dtypes)
    finally:
        egraph.pop()


def _load(
    egraph: EGraph,
    terms: list[L.Tensor],
    shapes: dict[str, tuple[int, ...]],
    consts: tuple[str, ...],
    dtypes: dict[str, int],
) -> EGraph:
    actions = []
    for name, dims in shapes.items():
        leaf = L.Tensor.weight(name) if name in consts else L.Tensor.input(name)
        actions += [
            set_(L.shape(leaf)).to(L.ivec(list(dims))),
            set_(L.dtype(leaf)).to(i64(dtypes.get(name, F))),
        ]
        if name in consts:  # as import marks a weight of moderate values (float adds may reassociate)
            actions.append(L.small_const(leaf))
    egraph.register(*actions, *[union(L.graph_output(k)).with_(term) for k, term in enumerate(terms)])
    return egraph


def _run(egraph: EGraph, rounds: int) -> None:
    everything = RULES.ruleset_for(RULES.names())
    for _ in range(rounds):
        egraph.run(shape_rules.saturate())
        egraph.run(everything)
    egraph.run(shape_rules.saturate())


@contextmanager
def _saturated(
    start: L.Tensor,
    goal: L.Tensor,
    shapes: dict[str, tuple[int, ...]],
    consts: tuple[str, ...],
    dtypes: dict[str, int] | None,
    rounds: int,
) -> Iterator[EGraph]:
    with _egraph([start, goal], shapes, consts, dtypes or {}) as egraph:
        _run(egraph, rounds)
        yield egraph


def prove(
    start: L.Tensor,
    goal: L.Tensor,
    shapes: dict[str, tuple[int, ...]],
    consts: tuple[str, ...] = (),
    dtypes: dict[str, int] | None = None,
    rounds: int = 4,
) -> None:
    """``start`` and ``goal`` end up in one e-class after a few rounds of every rule.

    Leaves named in ``shapes`` are graph inputs, or weights when named in ``consts``.
    """
    with _saturated(start, goal, shapes, consts, dtypes, rounds) as egraph:
        egraph.check(eq(start).to(goal))


def refute(
    start: L.Tensor,
    goal: L.Tensor,
    shapes: dict[str, tuple[int, ...]],
    consts: tuple[str, ...] = (),
    dtypes: dict[str, int] | None = None,
    rounds: int = 4,
) -> None:
    """The rules must NOT make ``start`` equal to ``goal`` (a guard must hold them apart)."""
    with _saturated(start, goal, shapes, consts, dtypes, rounds) as egraph:
        egraph.check_fail(eq(start).to(goal))


# ---------------------------------------------------------------- one family's prove tests
Proofs = dict[str, tuple[L.Tensor, L.Tensor, dict[str, tuple[int, ...]]]]
"""rule name -> (start, goal, leaf shapes)."""


def family_prove_tests(proofs: Proofs, consts: tuple[str, ...], rule_names: list[str]) -> tuple[Any, Any]:
    """``test_prove`` (each rule's start reaches its goal in two rounds) and
    ``test_every_rule_has_a_prove_test`` for a family; assign them to those names in its test module."""

    @pytest.mark.parametrize("rule", sorted(proofs))
    def test_prove(rule: str) -> None:
        start, goal, shapes = proofs[rule]
        prove(start, goal, shapes, consts, rounds=2)

    def test_every_rule_has_a_prove_test() -> None:
        assert set(rule_names) == set(proofs)

    return test_prove, test_every_rule_has_a_prove_test


def ints(*values: int) -> L.Tensor:
    """A rank-1 int64 constant (axes, sizes, shapes)."""
    return L.Tensor.ints(L.ivec(list(values)), 1)


def conv(x: L.Tensor, w: L.Tensor, b: L.Tensor | None = None) -> L.Tensor:
    """A 2-d Conv with unit stride and dilation and padding 1 on every side."""
    bias = L.Tensor.none() if b is None else b
    return L.conv(x, w, bias, L.ivec([1, 1]), L.ivec([1, 1, 1, 1]), L.ivec([1, 1]), 1)


def optimized_and_verified(
    nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto], x_shape: list[int], y_shape: list[int]
) -> tuple[onnx.ModelProto, Report]:
    """Optimize the float32 graph ``x -> nodes -> y`` (opset 13) with every rule; it must verify and
    pass the full checker."""
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", F, x_shape)],
        [helper.make_tensor_value_info("y", F, y_shape)],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    out, report = onnxsat.optimize(model)
    assert report.verification.status == "passed"
    onnx.checker.check_model(out, full_check=True)
    return out, report
