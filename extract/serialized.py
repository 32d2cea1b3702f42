"""egglog's serialized e-graph -> compact Python tables.

This is the one module that knows egglog's serialization format (egglog 13.x: nodes with
``op``, ``children`` node ids and ``eclass``; primitives as nodes whose op is the literal;
analysis functions as nodes in the e-class of their value). Only constructors on the
allow-list become extraction choices; analysis rows and primitives are values.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from typing import Any

from egglog import EGraph

from ..egraph.ops import BY_CTOR

LEAF_OPS = {"Tensor.input", "Tensor.weight", "Tensor.splat", "Tensor.ints", "Tensor.none"}
LIST_OPS = {"TList.nil", "TList.cons"}
CHOICE_OPS = LEAF_OPS | LIST_OPS | {"opaque"} | set(BY_CTOR)
CONST_LEAVES = {"Tensor.weight", "Tensor.splat", "Tensor.ints", "Tensor.none"}


@dataclass(frozen=True)
class Ref:
    """A reference to an e-class (a tensor or list argument)."""

    eclass: str


@dataclass(frozen=True)
class ENode:
    """One choice: constructor name and arguments (``Ref`` for e-classes, literals as Python values)."""

    op: str
    args: tuple[Any, ...]

    @property
    def children(self) -> list[str]:
        return [a.eclass for a in self.args if isinstance(a, Ref)]


@dataclass
class SerializedEGraph:
    """E-classes with their candidate e-nodes and per-class analysis values."""

    classes: dict[str, list[ENode]]
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    dtypes: dict[str, int] = field(default_factory=dict)
    origins: dict[str, int] = field(default_factory=dict)
    """E-class -> smallest original tensor index in it (from ``tensor_ref`` markers)."""
    roots: dict[int, str] = field(default_factory=dict)
    """Graph output index -> its e-class."""

    def num_nodes(self) -> int:
        return sum(len(v) for v in self.classes.values())


class SerializationTruncated(RuntimeError):
    """egglog omitted or truncated part of the e-graph: extraction would be wrong."""


def _literal(node: dict[str, Any], nodes: dict[str, dict[str, Any]]) -> Any:
    op = node["op"]
    eclass = node["eclass"]
    if op == "Vec" or eclass.startswith("egglog.builtins.Vec"):
        return tuple(_literal(nodes[c], nodes) for c in node["children"])
    if op.startswith('"'):
        return json.loads(op)
    if op in ("true", "false"):
        return op == "true"
    if eclass.startswith("f64") or any(ch in op for ch in ".eEn") and not op.lstrip("-").isdigit():
        if op in ("inf", "+inf", "-inf", "NaN", "nan"):
            return float(op.replace("NaN", "nan"))
        return float(op)
    return int(op)


def serialize(egraph: EGraph) -> SerializedEGraph:
    """Read the whole e-graph (raises ``SerializationTruncated`` if egglog cut anything)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        raw = egraph._serialize(split_primitive_outputs=False)
    for w in caught:
        text = str(w.message)
        if "Omitted" in text or "Truncated" in text:
            raise SerializationTruncated(text)
    data = json.loads(raw.to_json())
    nodes: dict[str, dict[str, Any]] = data["nodes"]
    out = SerializedEGraph(classes={})
    for node in nodes.values():
        op = node["op"]
        if op in CHOICE_OPS:
            args = []
            for child_id in node["children"]:
                child = nodes[child_id]
                if child_id.startswith("primitive-") or child["op"] == "Vec":
                    args.append(_literal(child, nodes))
                else:
                    args.append(Ref(child["eclass"]))
            out.classes.setdefault(node["eclass"], []).append(ENode(op, tuple(args)))
    values = {n["eclass"]: n for nid, n in nodes.items() if nid.startswith("primitive-")}
    for node in nodes.values():
        op = node["op"]
        if op == "tensor_ref":
            index = int(_literal(nodes[node["children"][0]], nodes))
            eclass = node["eclass"]
            out.origins[eclass] = min(index, out.origins.get(eclass, index))
        elif op in ("shape", "dtype") and node["children"]:
            tensor_class = nodes[node["children"][0]]["eclass"]
            value_node = values.get(node["eclass"])
            if value_node is None:
                continue
            value = _literal(value_node, nodes)
            if op == "shape":
                out.shapes[tensor_class] = tuple(value)
            else:
                out.dtypes[tensor_class] = int(value)
        elif op == "graph_output":
            out.roots[int(_literal(nodes[node["children"][0]], nodes))] = node["eclass"]
    for cls in out.classes.values():
        cls.sort(key=lambda n: (n.op, repr(n.args)))
    return out
