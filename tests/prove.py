"""egg-style prove tests: a start term reaches a goal term under the rules and fixed budgets."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager

from egglog import EGraph, eq, i64, set_, union
from onnx import TensorProto

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
        actions += [set_(L.shape(leaf)).to(L.ivec(list(dims))), set_(L.dtype(leaf)).to(i64(dtypes.get(name, F)))]
    egraph.register(*actions, *[union(L.graph_output(k)).with_(term) for k, term in enumerate(terms)])
    return egraph


def _run(egraph: EGraph, rounds: int) -> None:
    everything = RULES.ruleset_for(RULES.names())
    for _ in range(rounds):
        egraph.run(shape_rules.saturate())
        egraph.run(everything)
    egraph.run(shape_rules.saturate())


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
    with _egraph([start, goal], shapes, consts, dtypes or {}) as egraph:
        _run(egraph, rounds)
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
    with _egraph([start, goal], shapes, consts, dtypes or {}) as egraph:
        _run(egraph, rounds)
        egraph.check_fail(eq(start).to(goal))
