"""Exact, sharing-aware extraction as a 0-1 integer program solved by HiGHS.

One binary per candidate e-node (chosen) and one per e-class (used): the roots are used, a
used class chooses exactly one of its nodes, and a chosen node uses each of its child classes.
The objective is the sum of the chosen nodes' costs, priced exactly as ``extract_greedy``
prices them, so a class used twice is paid once. Acyclicity is enforced lazily: nodes whose
child is their own class are dropped up front, then each solution's chosen sub-graph is checked
and every cycle found is forbidden by a cut before the (warm-started) re-solve. Ordering
variables for every class (a big-M row per edge) give a weak relaxation and do not scale;
cycles are rare in chosen sub-graphs, so a few rounds of cuts settle them.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import highspy
import numpy as np

from ..egraph.graph_types import ENode, ExtractedGraph, SerializedEGraph
from .cost import CostModel
from .greedy import complete_kernels, extract_greedy, topological
from .pricing import Pricer, const_classes, dag_cost

MIP_GAP = 1e-9
"""Relative and absolute gap at which HiGHS stops: costs are microseconds, so this is exact."""
RANDOM_SEED = 0


@dataclass
class _Model:
    """Column layout of the integer program: node columns first, then one column per class."""

    nodes: list[tuple[str, ENode]]
    class_col: dict[str, int]
    node_cols: dict[str, list[int]]

    @property
    def num_cols(self) -> int:
        return len(self.nodes) + len(self.class_col)


def extract_ilp(
    eg: SerializedEGraph,
    cost: CostModel,
    roots: list[str],
    *,
    time_limit: float = 30.0,
    warm_start: ExtractedGraph | None = None,
) -> ExtractedGraph:
    """The cheapest acyclic program under ``cost`` (DAG cost), or the warm start if none is found in time.

    ``warm_start`` (greedy-DAG when omitted) seeds HiGHS with an incumbent and is the fallback:
    if the time limit passes before an acyclic solution at least as cheap is found, it is
    returned with ``optimal=False`` and ``gap`` measured against HiGHS's lower bound (the lower
    bound stays valid with cuts still missing, since they only remove solutions). The result's
    ``cost`` is always ``dag_cost`` of its nodes.
    """
    deadline = time.perf_counter() + time_limit
    const = const_classes(eg)
    price = Pricer(eg, cost, const)
    if warm_start is None:
        warm_start = extract_greedy(eg, cost, roots)
    warm_cost = dag_cost(warm_start.nodes, price)
    model = _build_model(eg, roots)
    highs = _new_highs()
    highs.passModel(_lp(model, price, roots))
    warm_values = _warm_values(model, warm_start)

    cuts: set[frozenset[tuple[str, str]]] = set()
    found: list[tuple[str, ENode]] | None = None
    proved = False
    bound = -math.inf
    while time.perf_counter() < deadline:
        values = _solve(highs, warm_values, deadline)
        info = highs.getInfo()
        if math.isfinite(info.mip_dual_bound):
            bound = max(bound, info.mip_dual_bound)
        choice = _decode(model, values) if values is not None else None
        if choice is None:
            break
        cycles = _cycles(choice, roots)
        if not cycles:
            found = complete_kernels(eg, topological(choice, roots), roots)
            proved = highs.getModelStatus() == highspy.HighsModelStatus.kOptimal
            break
        fresh = {_cycle_key(c): c for c in cycles if _cycle_key(c) not in cuts}
        if not fresh:
            break  # a cut was violated (tolerances): keep the warm start rather than loop
        for cycle in fresh.values():
            cuts.add(_cycle_key(cycle))
            _add_cycle_cut(highs, model, eg, cycle)

    if found is not None and dag_cost(found, price) <= warm_cost + 1e-9 * max(1.0, warm_cost):
        found_cost = dag_cost(found, price)
        gap = _gap(found_cost, bound)
        return ExtractedGraph(
            nodes=found,
            roots=roots,
            shapes=eg.shapes,
            dtypes=eg.dtypes,
            origins=eg.origins,
            const_classes=const,
            cost=found_cost,
            method="ilp",
            gap=0.0 if proved else gap,
            optimal=proved or gap == 0.0,
        )
    gap = _gap(warm_cost, bound)
    return dataclasses.replace(warm_start, cost=warm_cost, gap=gap, optimal=gap == 0.0)


def _solve(highs: highspy.Highs, warm_values: list[float] | None, deadline: float) -> list[float] | None:
    """Run HiGHS from the warm start; the solution's column values, or ``None`` without one.

    When presolve alone solves the model, HiGHS 1.16 reports the right objective but hands
    back the warm start as the solution; a solution whose cost disagrees with the reported
    objective is therefore re-solved once with presolve off (which then stays off).
    """
    for _ in range(2):
        highs.setOptionValue("time_limit", max(deadline - time.perf_counter(), 1e-3))
        if warm_values is not None:
            solution = highspy.HighsSolution()
            solution.col_value = warm_values
            solution.value_valid = True
            highs.setSolution(solution)
        highs.run()
        info = highs.getInfo()
        if int(info.primal_solution_status) != int(highspy.SolutionStatus.kSolutionStatusFeasible):
            return None
        values = list(highs.getSolution().col_value)
        objective = float(np.dot(highs.getLp().col_cost_, values))
        if abs(objective - info.objective_function_value) <= 1e-6 * max(1.0, abs(objective)):
            return values
        highs.setOptionValue("presolve", "off")
    return None


def _gap(cost: float, bound: float) -> float | None:
    """Relative gap to the lower bound; 0.0 within the solver's tolerance, ``None`` without a bound."""
    if not math.isfinite(bound):
        return None
    slack = cost - bound
    if slack <= MIP_GAP * max(1.0, abs(cost)):
        return 0.0
    return slack / abs(cost)


def _extractable(eg: SerializedEGraph) -> dict[str, list[ENode]]:
    """Per class, the nodes that can be part of an acyclic program.

    Drops duplicates, nodes whose child is their own class (always a cycle) and nodes with a
    child class that has no acyclic term at all (fixpoint from the leaves, like the tree pass).
    """
    cands = {c: [n for n in dict.fromkeys(nodes) if c not in n.children] for c, nodes in eg.classes.items()}
    waiting: dict[tuple[str, int], int] = {}
    users: dict[str, list[tuple[str, int]]] = {}
    ready: deque[str] = deque()
    for eclass, nodes in cands.items():
        for i, node in enumerate(nodes):
            kids = set(node.children)
            if not kids <= cands.keys():
                continue
            waiting[(eclass, i)] = len(kids)
            for kid in kids:
                users.setdefault(kid, []).append((eclass, i))
            if not kids:
                ready.append(eclass)
    ok: set[str] = set()
    while ready:
        eclass = ready.popleft()
        if eclass in ok:
            continue
        ok.add(eclass)
        for key in users.get(eclass, ()):
            waiting[key] -= 1
            if waiting[key] == 0 and key[0] not in ok:
                ready.append(key[0])
    return {
        c: [n for n in nodes if all(k in ok for k in n.children)] for c, nodes in cands.items() if c in ok
    }


def _build_model(eg: SerializedEGraph, roots: list[str]) -> _Model:
    """Columns for the extractable classes reachable from the roots, in a deterministic order."""
    cands = _extractable(eg)
    missing = [r for r in roots if r not in cands]
    if missing:
        raise RuntimeError(f"no acyclic term for output e-classes {missing}")
    reach: set[str] = set()
    stack = list(roots)
    while stack:
        eclass = stack.pop()
        if eclass in reach:
            continue
        reach.add(eclass)
        stack.extend(k for n in cands[eclass] for k in n.children if k not in reach)
    nodes: list[tuple[str, ENode]] = []
    node_cols: dict[str, list[int]] = {}
    for eclass in sorted(reach):
        node_cols[eclass] = list(range(len(nodes), len(nodes) + len(cands[eclass])))
        nodes.extend((eclass, n) for n in cands[eclass])
    class_col = {c: len(nodes) + i for i, c in enumerate(sorted(reach))}
    return _Model(nodes, class_col, node_cols)


def _lp(model: _Model, price: Pricer, roots: list[str]) -> highspy.HighsLp:
    """Rows: sum(x_n for n in c) - y_c = 0 per class; y_k - x_n >= 0 per node and child class."""
    starts, index, value, lower, upper = [0], [], [], [], []
    for eclass, cols in model.node_cols.items():
        index += [*cols, model.class_col[eclass]]
        value += [1.0] * len(cols) + [-1.0]
        starts.append(len(index))
        lower.append(0.0)
        upper.append(0.0)
    for col, (_, node) in enumerate(model.nodes):
        for kid in dict.fromkeys(node.children):
            index += [model.class_col[kid], col]
            value += [1.0, -1.0]
            starts.append(len(index))
            lower.append(0.0)
            upper.append(math.inf)
    n = model.num_cols
    col_lower = np.zeros(n)
    col_lower[[model.class_col[r] for r in roots]] = 1.0
    lp = highspy.HighsLp()
    lp.num_col_ = n
    lp.num_row_ = len(lower)
    lp.col_cost_ = np.array([price(c, node) for c, node in model.nodes] + [0.0] * len(model.class_col))
    lp.col_lower_ = col_lower
    lp.col_upper_ = np.ones(n)
    lp.row_lower_ = np.array(lower)
    lp.row_upper_ = np.array(upper)
    matrix = lp.a_matrix_
    matrix.format_ = highspy.MatrixFormat.kRowwise
    matrix.num_col_ = n
    matrix.num_row_ = len(lower)
    matrix.start_ = np.array(starts, dtype=np.int32)
    matrix.index_ = np.array(index, dtype=np.int32)
    matrix.value_ = np.array(value, dtype=np.float64)
    lp.integrality_ = [highspy.HighsVarType.kInteger] * n
    return lp


def _warm_values(model: _Model, warm: ExtractedGraph) -> list[float] | None:
    """The warm start as a full column vector, or ``None`` if it uses a node outside the model."""
    col_of = {key: col for col, key in enumerate(model.nodes)}
    values = [0.0] * model.num_cols
    for eclass, node in warm.nodes:
        col = col_of.get((eclass, node))
        if col is None:
            return None
        values[col] = 1.0
        values[model.class_col[eclass]] = 1.0
    return values


def _decode(model: _Model, values: list[float]) -> dict[str, ENode] | None:
    """Used class -> its chosen node; ``None`` if the solution is not 0-1 consistent."""
    choice: dict[str, ENode] = {}
    for eclass, col in model.class_col.items():
        if values[col] < 0.5:
            continue
        best = max(model.node_cols[eclass], key=lambda c: values[c])
        if values[best] < 0.5:
            return None
        choice[eclass] = model.nodes[best][1]
    for node in choice.values():
        if any(k not in choice for k in node.children):
            return None
    return choice


def _cycles(choice: dict[str, ENode], roots: list[str]) -> list[list[str]]:
    """Every cycle closed by a back edge of a DFS from the roots (as lists of classes, in order)."""
    found: list[list[str]] = []
    state: dict[str, int] = {}  # 1 = on the DFS path, 2 = done
    for root in roots:
        if root in state:
            continue
        path: list[str] = [root]
        at: dict[str, int] = {root: 0}
        stack: list[tuple[str, int]] = [(root, 0)]
        state[root] = 1
        while stack:
            eclass, i = stack[-1]
            kids = choice[eclass].children
            if i < len(kids):
                stack[-1] = (eclass, i + 1)
                kid = kids[i]
                s = state.get(kid)
                if s == 1:
                    found.append(path[at[kid] :])
                elif s is None:
                    state[kid] = 1
                    at[kid] = len(path)
                    path.append(kid)
                    stack.append((kid, 0))
            else:
                stack.pop()
                path.pop()
                del at[eclass]
                state[eclass] = 2
    return found


def _cycle_key(cycle: list[str]) -> frozenset[tuple[str, str]]:
    return frozenset(zip(cycle, cycle[1:] + cycle[:1], strict=True))


def _add_cycle_cut(highs: highspy.Highs, model: _Model, eg: SerializedEGraph, cycle: list[str]) -> None:
    """Forbid the class cycle c1 -> c2 -> ... -> ck -> c1: at most k-1 of its edges chosen.

    An edge ci -> cj is any node of ci with child cj, so one cut removes every combination of
    nodes that closes this class cycle, not only the one just found (each class picks at most
    one node, so the cut stays valid for every acyclic program).
    """
    cols: list[int] = []
    for eclass, nxt in _cycle_key(cycle):
        cols += [c for c in model.node_cols[eclass] if nxt in model.nodes[c][1].children]
    cols = sorted(set(cols))
    highs.addRow(
        -math.inf, float(len(cycle) - 1), len(cols), np.array(cols, dtype=np.int32), np.ones(len(cols))
    )


def _new_highs() -> highspy.Highs:
    """A silent, single-threaded, seeded HiGHS instance (deterministic runs)."""
    with _quiet_stdout():  # HiGHS prints its banner from the constructor, before any option applies
        highs = highspy.Highs()
    highs.setOptionValue("output_flag", False)
    highs.setOptionValue("threads", 1)
    highs.setOptionValue("random_seed", RANDOM_SEED)
    highs.setOptionValue("mip_rel_gap", MIP_GAP)
    highs.setOptionValue("mip_abs_gap", MIP_GAP)
    return highs


@contextmanager
def _quiet_stdout() -> Iterator[None]:
    """Point the process's stdout (fd 1, where C code writes) at /dev/null for the duration."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
