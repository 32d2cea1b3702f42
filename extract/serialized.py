"""egglog's serialized e-graph -> compact Python tables.

This is the one module that knows egglog's serialization format (egglog 13.x: nodes with
``op``, ``children`` node ids and ``eclass``; primitives as nodes whose op is the literal;
analysis functions as nodes in the e-class of their value). Only constructors on the
allow-list become extraction choices; analysis rows and primitives are values.
"""

from __future__ import annotations

import gc
import json
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import orjson
from egglog import EGraph

from ..egraph.graph_types import CHOICE_OPS, ENode, Ref, SerializedEGraph


class SerializationTruncated(RuntimeError):
    """egglog omitted or truncated part of the e-graph: extraction would be wrong."""


def _literal(node_id: str, nodes: dict[str, dict[str, Any]], cache: dict[str, Any]) -> Any:
    """The Python value of a primitive node (int, float, bool, str, or a tuple for a Vec), cached by id."""
    if node_id in cache:
        return cache[node_id]
    node = nodes[node_id]
    op = node["op"]
    eclass = node["eclass"]
    value: Any
    if op == "Vec" or eclass.startswith("egglog.builtins.Vec"):
        value = tuple(_literal(c, nodes, cache) for c in node["children"])
    elif op.startswith('"'):
        value = op[1:-1] if "\\" not in op else json.loads(op)
    elif op in ("true", "false"):
        value = op == "true"
    elif eclass.startswith("f64") or any(ch in op for ch in ".eEn") and not op.lstrip("-").isdigit():
        value = float(op.replace("NaN", "nan")) if op in ("inf", "+inf", "-inf", "NaN", "nan") else float(op)
    else:
        value = int(op)
    cache[node_id] = value
    return value


def _raw_json(egraph: EGraph) -> bytes | str:
    """egglog's JSON serialization of the whole e-graph; its Omitted/Truncated warnings are errors."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        raw = egraph._serialize(split_primitive_outputs=False)
    for w in caught:
        text = str(w.message)
        if "Omitted" in text or "Truncated" in text:
            raise SerializationTruncated(text)
    return raw.to_json()


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector: building ~10^6 small acyclic objects (the parsed
    JSON, the e-node tables) otherwise triggers collections that scan all of them, again and
    again, and cost more than the work itself. Reference counting still frees everything."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def serialize(egraph: EGraph) -> SerializedEGraph:
    """Read the whole e-graph (raises ``SerializationTruncated`` if egglog cut anything)."""
    with gc_paused():
        return _serialize(egraph)


def _serialize(egraph: EGraph) -> SerializedEGraph:
    """The body of ``serialize``.

    One pass over egglog's nodes: allow-listed constructors become ``ENode`` choices, and the
    ``shape``/``dtype``/``tensor_ref``/``graph_output`` analysis rows fill the side tables (a
    primitive value's node id is ``"primitive-" + its e-class``).
    """
    nodes: dict[str, dict[str, Any]] = orjson.loads(_raw_json(egraph))["nodes"]
    out = SerializedEGraph(classes={})
    literals: dict[str, Any] = {}
    refs: dict[str, Ref] = {}
    keyed: dict[str, list[tuple[tuple[str, tuple[str, ...]], ENode]]] = {}
    choice_ops = CHOICE_OPS
    for node in nodes.values():
        op = node["op"]
        if op in choice_ops:
            args: list[Any] = []
            key: list[str] = []
            for child_id in node["children"]:
                child = nodes[child_id]
                if child_id.startswith("primitive-") or child["op"] == "Vec":
                    value = _literal(child_id, nodes, literals)
                    args.append(value)
                    key.append(repr(value))
                else:
                    eclass = child["eclass"]
                    ref = refs.get(eclass)
                    if ref is None:
                        ref = refs[eclass] = Ref(eclass)
                    args.append(ref)
                    key.append(eclass)
            keyed.setdefault(node["eclass"], []).append(((op, tuple(key)), ENode(op, tuple(args))))
        elif op == "shape" or op == "dtype":
            kids = node["children"]
            value_id = "primitive-" + node["eclass"]
            if not kids or value_id not in nodes:
                continue
            tensor_class = nodes[kids[0]]["eclass"]
            value = _literal(value_id, nodes, literals)
            if op == "shape":
                out.shapes[tensor_class] = tuple(value)
            else:
                out.dtypes[tensor_class] = int(value)
        elif op == "tensor_ref":
            index = int(_literal(node["children"][0], nodes, literals))
            eclass = node["eclass"]
            out.origins[eclass] = min(index, out.origins.get(eclass, index))
        elif op == "graph_output":
            out.roots[int(_literal(node["children"][0], nodes, literals))] = node["eclass"]
    for eclass, entries in keyed.items():
        if len(entries) > 1:
            entries.sort(key=lambda e: e[0])
        out.classes[eclass] = [e[1] for e in entries]
    return out
