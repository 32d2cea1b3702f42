"""Extractors: tree, greedy-DAG and the exact ILP on hand-built and real saturated e-graphs.

Hand-built e-graphs use a fixed cost per op so the expected optimum can be worked out by hand
(or by brute force over every choice); real ones are light models and examples/ after
saturation, priced by the roofline model and verified on onnxruntime after export.
"""

from __future__ import annotations

import itertools
import math
import random
import time
from dataclasses import dataclass

import onnx
import pytest

from onnxsat.base.options import Budgets
from onnxsat.egraph.exporter import to_onnx
from onnxsat.egraph.fold import fold_constants
from onnxsat.egraph.graph_types import ENode, ExtractedGraph, Ref, SerializedEGraph
from onnxsat.egraph.importer import from_onnx
from onnxsat.extract.cost import NodeCtx, RooflineCost
from onnxsat.extract.greedy import extract_greedy, topological
from onnxsat.extract.ilp import extract_ilp
from onnxsat.extract.pricing import Pricer, const_classes, dag_cost
from onnxsat.extract.serialized import serialize
from onnxsat.rules.schedule import saturate, select_rules
from onnxsat.verification import compare_models

from .models import EXAMPLES, load_light


@dataclass(frozen=True)
class OpCost:
    """A fixed cost per op name: the simplest cost model."""

    costs: dict[str, float]
    name: str = "fixed"

    def node_cost(self, ctx: NodeCtx) -> float:
        return self.costs[ctx.node.op]


def egraph(spec: dict[str, list[tuple[str, tuple[str, ...]]]]) -> SerializedEGraph:
    """``{"A": [("op", ("B", "C")), ...]}``: class -> its nodes as (op, child classes)."""
    return SerializedEGraph(
        classes={
            c: [ENode(op, tuple(Ref(k) for k in kids)) for op, kids in nodes] for c, nodes in spec.items()
        }
    )


def extract_all(eg: SerializedEGraph, cost: OpCost, roots: list[str]) -> dict[str, ExtractedGraph]:
    greedy = extract_greedy(eg, cost, roots)
    return {
        "tree": extract_greedy(eg, cost, roots, tree_only=True),
        "greedy-dag": greedy,
        "ilp": extract_ilp(eg, cost, roots, warm_start=greedy),
    }


def brute_force(eg: SerializedEGraph, cost: OpCost, roots: list[str]) -> float:
    """The true optimum: every combination of one node per class, acyclic ones scored by DAG cost."""
    price = Pricer(eg, cost, const_classes(eg))
    classes = sorted(eg.classes)
    best = math.inf
    for combo in itertools.product(*(eg.classes[c] for c in classes)):
        try:
            nodes = topological(dict(zip(classes, combo, strict=True)), roots)
        except RuntimeError:
            continue
        best = min(best, dag_cost(nodes, price))
    return best


def assert_sound(eg: SerializedEGraph, cost: OpCost, roots: list[str], graph: ExtractedGraph) -> None:
    """Acyclic, in topological order, covering the roots, and ``cost`` is the independent DAG score."""
    choice = graph.choice()
    assert topological(choice, roots) == graph.nodes
    assert all(node in eg.classes[c] for c, node in graph.nodes)
    assert math.isfinite(graph.cost)
    assert graph.cost == pytest.approx(dag_cost(graph.nodes, Pricer(eg, cost, const_classes(eg))))


# ---------------------------------------------------------------- sharing


SHARING = egraph(
    {
        # Each output can use its own private input (cheap locally) or a shared expensive one.
        "R1": [("p1", ("A",)), ("q1", ("S",))],
        "R2": [("p2", ("B",)), ("q2", ("S",))],
        "A": [("a", ())],
        "B": [("b", ())],
        "S": [("s", ())],
    }
)
SHARING_COST = OpCost({"p1": 1, "p2": 1, "q1": 2, "q2": 2, "a": 10, "b": 10, "s": 12})


def test_ilp_finds_the_sharing_greedy_misses() -> None:
    roots = ["R1", "R2"]
    result = extract_all(SHARING, SHARING_COST, roots)
    # Greedy prices each output's sub-DAG alone: 1 + 10 < 2 + 12, so both take private inputs.
    assert result["greedy-dag"].cost == pytest.approx(22.0)
    ilp = result["ilp"]
    assert ilp.cost == pytest.approx(16.0)  # both take q: 2 + 2 + 12, the shared S paid once
    assert ilp.method == "ilp" and ilp.optimal and ilp.gap == 0.0
    assert {c: n.op for c, n in ilp.nodes} == {"R1": "q1", "R2": "q2", "S": "s"}
    for graph in result.values():
        assert_sound(SHARING, SHARING_COST, roots, graph)


def test_ilp_with_a_shared_chain_pays_each_class_once() -> None:
    # A diamond: the two outputs can both read M (which needs S) or their own cheap-looking paths.
    eg = egraph(
        {
            "R1": [("x1", ("M",)), ("y1", ("P",))],
            "R2": [("x2", ("M",)), ("y2", ("Q",))],
            "M": [("m", ("S",))],
            "P": [("pp", ())],
            "Q": [("qq", ())],
            "S": [("s", ())],
        }
    )
    cost = OpCost({"x1": 1, "x2": 1, "y1": 1, "y2": 1, "m": 3, "s": 4, "pp": 6, "qq": 6})
    result = extract_all(eg, cost, ["R1", "R2"])
    assert result["greedy-dag"].cost == pytest.approx(14.0)
    assert result["ilp"].cost == pytest.approx(9.0) == brute_force(eg, cost, ["R1", "R2"])


# ---------------------------------------------------------------- cycles


CYCLIC = {
    "self-loop": (
        egraph({"A": [("loop", ("A",)), ("leaf", ())]}),
        OpCost({"loop": 0, "leaf": 5}),
        ["A"],
        5.0,
    ),
    "cheapest-points-back": (
        # A's cheapest node reads B, whose cheapest node reads A again.
        egraph({"A": [("f", ("B",)), ("a", ())], "B": [("g", ("A",)), ("b", ())]}),
        OpCost({"f": 0, "g": 0, "a": 10, "b": 3}),
        ["A", "B"],
        3.0,
    ),
    "three-cycle": (
        egraph(
            {
                "A": [("ab", ("B",)), ("a", ())],
                "B": [("bc", ("C",)), ("b", ())],
                "C": [("ca", ("A",)), ("c", ())],
                "R": [("r", ("A", "C"))],
            }
        ),
        OpCost({"ab": 0, "bc": 0, "ca": 0, "a": 7, "b": 8, "c": 9, "r": 1}),
        ["R"],
        8.0,  # r + a, with C -> A: one leaf breaks the whole cycle
    ),
    "nested-cycles": (
        # Two cycles through X (X-Y-X and X-Y-Z-X); the zero-cost choices form both.
        egraph(
            {
                "X": [("xy", ("Y",)), ("x", ())],
                "Y": [("yx", ("X",)), ("yz", ("Z",)), ("y", ())],
                "Z": [("zx", ("X",)), ("zz", ("Z", "X")), ("z", ())],
                "R": [("r", ("X", "Z"))],
            }
        ),
        OpCost({"xy": 0, "yx": 0, "yz": 0, "zx": 0, "zz": 0, "x": 4, "y": 6, "z": 5, "r": 1}),
        ["R"],
        5.0,  # r + x, with Z -> X
    ),
}


@pytest.mark.parametrize("case", sorted(CYCLIC))
def test_every_extractor_returns_an_acyclic_program(case: str) -> None:
    eg, cost, roots, optimum = CYCLIC[case]
    result = extract_all(eg, cost, roots)
    for graph in result.values():
        assert_sound(eg, cost, roots, graph)
    assert result["ilp"].cost <= result["greedy-dag"].cost + 1e-9 <= result["tree"].cost + 2e-9
    assert result["ilp"].cost == pytest.approx(optimum) == brute_force(eg, cost, roots)
    assert result["ilp"].optimal


def test_ilp_matches_brute_force_on_random_egraphs() -> None:
    """Random small e-graphs with cycles, self-loops and zero costs: ILP is the true optimum."""
    rng = random.Random(7)
    checked = better = 0
    while checked < 150:
        n = rng.randint(2, 6)
        spec: dict[str, list[tuple[str, tuple[str, ...]]]] = {}
        costs: dict[str, float] = {"leaf": 1.0}
        for i in range(n):
            nodes = []
            for _ in range(rng.randint(1, 3)):
                op = f"op{len(costs)}"
                costs[op] = rng.choice([0.0, 1.0, 2.0, 5.0, rng.uniform(0.0, 10.0)])
                nodes.append(
                    (op, tuple(f"c{rng.randrange(n)}" for _ in range(rng.choice([0, 1, 1, 2, 2, 3]))))
                )
            spec[f"c{i}"] = nodes
        spec[f"c{n - 1}"].append(("leaf", ()))
        eg, cost = egraph(spec), OpCost(costs)
        roots = sorted({f"c{rng.randrange(n)}" for _ in range(rng.randint(1, 2))})
        optimum = brute_force(eg, cost, roots)
        if math.isinf(optimum):
            continue
        result = extract_all(eg, cost, roots)
        for graph in result.values():
            assert_sound(eg, cost, roots, graph)
        ilp = result["ilp"]
        assert ilp.optimal and ilp.cost == pytest.approx(optimum, abs=1e-9), spec
        assert ilp.cost <= result["greedy-dag"].cost + 1e-9 <= result["tree"].cost + 2e-9
        checked += 1
        better += ilp.cost < result["greedy-dag"].cost - 1e-9
    assert better > 0  # the random cases do exercise sharing that greedy misses


def test_ilp_is_exact_when_presolve_solves_the_model() -> None:
    """Regression: HiGHS 1.16 returns the warm start as the solution when presolve alone finishes."""
    eg = egraph(
        {
            "c0": [("op0", ()), ("op1", ("c3", "c3")), ("op2", ("c1", "c4"))],
            "c1": [("op3", ("c1",)), ("op4", ("c2", "c2"))],
            "c2": [("op5", ("c1", "c3")), ("op6", ("c4",)), ("op7", ("c3", "c1"))],
            "c3": [("op8", ("c0", "c0"))],
            "c4": [("op9", ()), ("op10", ("c4", "c3")), ("op11", ("c4",)), ("leaf", ())],
        }
    )
    costs = [10, 5, 2.5, 0, 2, 1, 3, 3, 3, 5, 8, 6]
    cost = OpCost({f"op{i}": float(c) for i, c in enumerate(costs)} | {"leaf": 1.0})
    ilp = extract_ilp(eg, cost, ["c3"])
    assert ilp.cost == pytest.approx(brute_force(eg, cost, ["c3"])) == pytest.approx(11.5)


# ---------------------------------------------------------------- limits and fallbacks


def test_ilp_without_time_returns_the_warm_start() -> None:
    greedy = extract_greedy(SHARING, SHARING_COST, ["R1", "R2"])
    result = extract_ilp(SHARING, SHARING_COST, ["R1", "R2"], time_limit=0.0, warm_start=greedy)
    assert result.nodes == greedy.nodes and result.method == greedy.method
    assert not result.optimal and result.gap is None  # no solve ran, so no bound either
    assert result.cost == pytest.approx(22.0)


def test_ilp_warm_start_defaults_to_greedy_and_is_deterministic() -> None:
    first = extract_ilp(SHARING, SHARING_COST, ["R1", "R2"])
    second = extract_ilp(SHARING, SHARING_COST, ["R1", "R2"])
    assert first.nodes == second.nodes and first.cost == second.cost == pytest.approx(16.0)


def test_ilp_rejects_outputs_without_a_term() -> None:
    eg = egraph({"A": [("loop", ("A",))], "B": [("b", ())]})
    with pytest.raises(RuntimeError, match="finite-cost"):
        extract_ilp(eg, OpCost({"loop": 1, "b": 1}), ["A"])


# ---------------------------------------------------------------- real saturated e-graphs


REAL = {
    "squeezenet": lambda: load_light("light_squeezenet.onnx"),
    "resnet50": lambda: load_light("light_resnet50.onnx"),
    # Here the ILP beats greedy-DAG (keeps BatchNormalization where greedy decomposes it).
    "inception_v2": lambda: load_light("light_inception_v2.onnx"),
    "transformer_block": lambda: onnx.load(str(EXAMPLES / "transformer_block.onnx")),
    "small_cnn": lambda: onnx.load(str(EXAMPLES / "small_cnn.onnx")),
}
SLOW = {"resnet50", "inception_v2"}
ILP_SECONDS = 30.0


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in REAL])
def test_extractors_on_saturated_models(name: str) -> None:
    model = REAL[name]()
    program = from_onnx(model)
    saturate(program, Budgets(), select_rules())
    eg = serialize(program.egraph)
    roots = [eg.roots[i] for i in range(len(program.outputs))]
    cost = RooflineCost()
    tree = extract_greedy(eg, cost, roots, tree_only=True)
    greedy = extract_greedy(eg, cost, roots)
    start = time.perf_counter()
    ilp = extract_ilp(eg, cost, roots, time_limit=ILP_SECONDS, warm_start=greedy)
    seconds = time.perf_counter() - start
    assert ilp.cost <= greedy.cost + 1e-6 and greedy.cost <= tree.cost + 1e-6
    price = Pricer(eg, cost, const_classes(eg))
    assert ilp.cost == pytest.approx(dag_cost(ilp.nodes, price))
    # Within its limit (plus model building), or it hands back the incumbent with a gap.
    assert seconds <= ILP_SECONDS + 5.0
    assert ilp.optimal or (ilp.gap is None or ilp.gap > 0.0)
    exported = to_onnx(program, ilp)
    folded, _ = fold_constants(exported)
    onnx.checker.check_model(folded, full_check=True)
    result = compare_models(model, folded)
    assert result.ok, result
