"""The built in-tree rules on disk, so a new process does not build them again in Python.

Building the in-tree families' ~600 egglog rules and the ~500 analysis rules (``egraph/shape_defs.py``)
from their Python definitions takes seconds; a built rule is a declaration tree (``RuleDecl``) over
the tensor language, plain data. The file keeps, per rule module, its families with each rule's
declaration, and the analysis rules in order, each with the tables it reads and writes
(``egraph.reach``), keyed like the rule
listing (``listing.listing_key``: onnxsat and egglog versions, the rule sources) and checked on
load; any mismatch or error means the rules are built from their modules again. Only the
declarations are stored: egglog still declares the rules into each new e-graph (a saved e-graph
cannot be reloaded with its rules). The PET site-rule modules are always imported (their rules
are Python verifiers, not egglog rules).

The file goes through `onnxsat.base.disk_cache` (a private 0700 directory, a sha256 per entry,
fsync before rename) and holds JSON: the declaration trees as a list of nodes (each composite once,
later nodes naming earlier ones by index), read back by building only egglog's declaration
dataclasses, tuples, lists and string-keyed dicts. Nothing is unpickled, so a planted file cannot
run code; a damaged or foreign one only costs building the rules again.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path
from typing import Any

import egglog.declarations as egg_declarations
import orjson
from egglog import RewriteOrRule
from egglog.declarations import Declarations

from onnxsat.base import disk_cache

from ..egraph import lang as L
from ..egraph import shapes
from ..egraph.reach import reach_cached, remember
from ..extract.serialized import gc_paused
from .listing import listing_key
from .registry import Family

TABLE_FILE = "rule-table.json"


def _language() -> Declarations:
    """Every declaration of the tensor language (what the in-tree rules refer to)."""
    found = [v for v in vars(L).values() if hasattr(v, "__egg_decls__")]
    return Declarations.create(*found, *shapes.TABLES)


def _encode(value: Any) -> dict[str, Any]:
    """``value`` (declaration dataclasses, tuples, lists, str-keyed dicts, scalars) as JSON data:
    ``{"nodes": [...], "root": ...}``, each composite written once, shared subtrees by index."""
    index: dict[int, int] = {}
    nodes: list[dict[str, Any]] = []
    keep: list[Any] = []  # ids stay unique while the values live

    def enc(v: Any) -> Any:
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        if id(v) in index:
            return {"r": index[id(v)]}
        if isinstance(v, tuple):
            node: dict[str, Any] = {"t": [enc(x) for x in v]}
        elif isinstance(v, list):
            node = {"l": [enc(x) for x in v]}
        elif isinstance(v, dict) and all(isinstance(k, str) for k in v):
            node = {"d": {k: enc(x) for k, x in v.items()}}
        elif dataclasses.is_dataclass(v) and type(v).__module__ == egg_declarations.__name__:
            node = {"c": type(v).__name__, "a": [enc(getattr(v, f.name)) for f in dataclasses.fields(v)]}
        else:
            raise TypeError(f"{type(v).__name__} has no place in the rule-table cache")
        keep.append(v)
        index[id(v)] = len(nodes)
        nodes.append(node)
        return {"r": index[id(v)]}

    return {"nodes": nodes, "root": enc(value)}


@functools.cache
def _declaration_class(name: str) -> type:
    cls = getattr(egg_declarations, name, None)
    if not (
        isinstance(cls, type)
        and dataclasses.is_dataclass(cls)
        and cls.__module__ == egg_declarations.__name__
    ):
        raise ValueError(f"{name!r} is not an egglog declaration class")
    return cls


def _decode(data: dict[str, Any]) -> Any:
    """The value ``_encode`` wrote; builds nothing but declaration dataclasses and plain data."""
    built: list[Any] = []

    def dec(v: Any) -> Any:
        return built[v["r"]] if isinstance(v, dict) else v  # an index past the end fails: refused

    for node in data["nodes"]:
        if "t" in node:
            built.append(tuple(dec(x) for x in node["t"]))
        elif "c" in node:
            built.append(_declaration_class(node["c"])(*[dec(x) for x in node["a"]]))
        elif "l" in node:
            built.append([dec(x) for x in node["l"]])
        else:
            built.append({k: dec(x) for k, x in node["d"].items()})
    return dec(data["root"])


def load(cache_dir: str | Path) -> dict[str, list[Family]] | None:
    """Module name -> its families as stored, or None (no file, another key, damaged or foreign).
    The stored analysis rules go to ``shapes.use_stored`` (unless this process built them already)."""
    directory = disk_cache.private_dir(cache_dir)
    raw = disk_cache.read(directory / TABLE_FILE) if directory is not None else None
    if raw is None:
        return None
    try:
        with gc_paused():  # ~60,000 small objects: half the load time is the collector walking them
            stored = _decode(orjson.loads(raw))
        if stored["key"] != listing_key():
            return None
        decls = _language()
        parts: dict[str, list[Family]] = {}
        for module, families in stored["modules"].items():
            parts[module] = [_family(row, decls) for row in families]
        analysis = [_rule(decls, row) for row in stored["analysis"]]
        shapes.use_stored(analysis)
        return parts
    except Exception:  # a damaged or foreign file only costs building the rules again
        return None


def store(cache_dir: str | Path, parts: dict[str, list[Family]]) -> None:
    """Keep ``parts`` (module name -> families) when every rule refers to the language alone."""
    decls = _language()
    rows = {}
    for module, families in parts.items():
        for fam in families:
            for rules in fam.egg_rules.values():
                if not all(_within(built.__egg_decls__, decls) for _, built in rules):
                    return  # a rule uses a declaration of its own: not stored, built every time
        rows[module] = [_row(fam) for fam in families]
    analysis = shapes.in_tree_rules()
    if not all(_within(built.__egg_decls__, decls) for built in analysis):
        return
    try:
        payload = {"key": listing_key(), "modules": rows, "analysis": [_stored(built) for built in analysis]}
        data = json.dumps(_encode(payload), separators=(",", ":")).encode()
    except (TypeError, ValueError):
        return
    directory = disk_cache.private_dir(cache_dir)
    if directory is not None:
        disk_cache.write(directory / TABLE_FILE, data)


def _within(used: Declarations, language: Declarations) -> bool:
    return (
        used._functions.keys() <= language._functions.keys()
        and used._classes.keys() <= language._classes.keys()
        and used._constants.keys() <= language._constants.keys()
    )


def _row(fam: Family) -> dict[str, Any]:
    return {
        "name": fam.name,
        "default_off": fam.default_off,
        "names": list(fam.names),
        "rules": {n: [(egg, *_stored(built)) for egg, built in rules] for n, rules in fam.egg_rules.items()},
        "tolerances": dict(fam.tolerances),
    }


def _family(row: dict[str, Any], decls: Declarations) -> Family:
    fam = Family(row["name"], default_off=row["default_off"], tolerances=dict(row["tolerances"]))
    fam.names = list(row["names"])
    fam.egg_rules = {n: [(egg, _rule(decls, rest)) for egg, *rest in rules] for n, rules in row["rules"].items()}
    return fam


def _stored(built: RewriteOrRule) -> tuple[Any, tuple[str, ...], tuple[str, ...]]:
    """A rule's declaration with what it reads and writes (``egraph.reach``), so a new process need
    not walk the declaration again."""
    reach = reach_cached(built)
    return built.decl, tuple(sorted(reach.needs)), tuple(sorted(reach.creates))


def _rule(decls: Declarations, stored: Any) -> RewriteOrRule:
    decl, needs, creates = stored
    built = RewriteOrRule(decls, decl)
    remember(built, needs, creates)
    return built
