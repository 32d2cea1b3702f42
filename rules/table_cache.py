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
fsync before rename) and holds JSON: the declaration trees as one flat list of nodes (each composite
once, after its parts, later nodes naming earlier ones by index), read back by building only
egglog's declaration dataclasses, tuples, lists and string-keyed dicts, and only for the rules a run
declares (most stored rules are never built in a given run). Nothing is unpickled, so a planted file
cannot run code; a damaged or foreign one only costs building the rules again.
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

TABLE_FILE = "rule-table-2.json"
FORMAT = 2
"""The file's layout (``_Encoder``); another layout is refused, not misread."""


def _language() -> Declarations:
    """Every declaration of the tensor language (what the in-tree rules refer to)."""
    found = [v for v in vars(L).values() if hasattr(v, "__egg_decls__")]
    return Declarations.create(*found, *shapes.TABLES)


_TUPLE, _LIST, _DICT, _DECL = 0, 1, 2, 3
"""Node kinds of the file: ``[kind, ...]``; a declaration is ``[_DECL, class index, *fields]``."""


class _Encoder:
    """Declaration trees (dataclasses of ``egglog.declarations``, tuples, lists, str-keyed dicts,
    scalars) as one flat node list: each composite written once, after its parts, as a JSON list;
    inside a node an int is the index of an earlier node, ``[n]`` the literal int n, and any
    other scalar itself."""

    def __init__(self) -> None:
        self.nodes: list[list[Any]] = []
        self.classes: list[str] = []
        self._index: dict[int, int] = {}
        self._class_index: dict[str, int] = {}
        self._keep: list[Any] = []  # ids stay unique while the values live

    def root(self, value: Any) -> int:
        """The node index of the composite ``value``."""
        out = self._value(value)
        if not isinstance(out, int):
            raise TypeError("a stored declaration must be a composite")
        return out

    def _value(self, v: Any) -> Any:
        if v is None or isinstance(v, (bool, float, str)):
            return v
        if isinstance(v, int):
            return [v]
        if id(v) in self._index:
            return self._index[id(v)]
        if isinstance(v, tuple):
            node: list[Any] = [_TUPLE, *[self._value(x) for x in v]]
        elif isinstance(v, list):
            node = [_LIST, *[self._value(x) for x in v]]
        elif isinstance(v, dict) and all(isinstance(k, str) for k in v):
            node = [_DICT]
            for k, x in v.items():
                node += [k, self._value(x)]
        elif dataclasses.is_dataclass(v) and type(v).__module__ == egg_declarations.__name__:
            name = type(v).__name__
            cls = self._class_index.setdefault(name, len(self.classes))
            if cls == len(self.classes):
                self.classes.append(name)
            node = [_DECL, cls, *[self._value(getattr(v, f.name)) for f in dataclasses.fields(v)]]
        else:
            raise TypeError(f"{type(v).__name__} has no place in the rule-table cache")
        self._keep.append(v)
        self._index[id(v)] = len(self.nodes)
        self.nodes.append(node)
        return self._index[id(v)]


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


class _Decoder:
    """Builds the nodes ``_Encoder`` wrote on demand, each once: nothing but declaration
    dataclasses and plain data. ``check`` refuses a file whose nodes name anything but earlier
    nodes and egglog declaration classes, so building a node later cannot fail or loop."""

    def __init__(self, classes: list[str], nodes: list[list[Any]]):
        self._classes = [_declaration_class(name) for name in classes]  # refuses any other class
        self._nodes = nodes
        self._built: list[Any] = [None] * len(nodes)

    def __len__(self) -> int:
        return len(self._nodes)

    def check(self) -> None:
        n_classes = len(self._classes)
        for i, node in enumerate(self._nodes):
            kind = node[0]
            if kind == _DECL:
                if not 0 <= node[1] < n_classes:
                    raise ValueError("unknown declaration class")
                parts = node[2:]
            elif kind == _DICT:
                keys, parts = node[1::2], node[2::2]
                if not all(type(k) is str for k in keys) or len(keys) != len(parts):
                    raise ValueError("malformed mapping")
            elif kind in (_TUPLE, _LIST):
                parts = node[1:]
            else:
                raise ValueError("unknown node kind")
            for x in parts:
                t = type(x)
                if t is int:
                    if not 0 <= x < i:
                        raise ValueError("a node names a later one")
                elif t is list:
                    if len(x) != 1 or type(x[0]) is not int:
                        raise ValueError("malformed literal")
                elif t is dict:
                    raise ValueError("malformed node")

    def get(self, index: int) -> Any:
        """The value of node ``index``, building it (and the parts not built yet) first."""
        built, nodes = self._built, self._nodes
        if built[index] is not None:
            return built[index]
        todo = [index]
        while todo:  # children before parents, without recursion (rules nest deeply)
            i = todo[-1]
            if built[i] is not None:
                todo.pop()
                continue
            node = nodes[i]
            parts = node[2::2] if node[0] == _DICT else node[2:] if node[0] == _DECL else node[1:]
            missing = [x for x in parts if type(x) is int and built[x] is None]
            if missing:
                todo.extend(missing)
                continue
            built[i] = self._make(node)
            todo.pop()
        return built[index]

    def _make(self, node: list[Any]) -> Any:
        built = self._built

        def arg(x: Any) -> Any:
            t = type(x)
            return built[x] if t is int else x[0] if t is list else x

        kind = node[0]
        if kind == _DECL:
            return self._classes[node[1]](*[arg(x) for x in node[2:]])
        if kind == _TUPLE:
            return tuple([arg(x) for x in node[1:]])
        if kind == _LIST:
            return [arg(x) for x in node[1:]]
        return {node[i]: arg(node[i + 1]) for i in range(1, len(node), 2)}


class _StoredRule(RewriteOrRule):
    """A rule read from the cache: its declaration is built when first used (a run declares only
    the rules its model can need, ``egraph.reach``, so most stored rules are never built)."""

    def __init__(self, decls: Declarations, decoder: _Decoder, index: int):
        self.__egg_decls__ = decls
        self.ruleset = None
        self._decoder = decoder
        self._index = index
        self._decl: Any = None

    @property  # type: ignore[override]
    def decl(self) -> Any:
        if self._decl is None:
            self._decl = self._decoder.get(self._index)
        return self._decl

    @decl.setter
    def decl(self, value: Any) -> None:
        self._decl = value


def holds_table(cache_dir: str | Path) -> bool:
    """Whether ``cache_dir`` has a table file (not checked: a stale or damaged one is rebuilt by
    the process that reads it)."""
    return (Path(cache_dir) / TABLE_FILE).is_file()


def load(cache_dir: str | Path) -> dict[str, list[Family]] | None:
    """Module name -> its families as stored, or None (no file, another key, damaged or foreign).
    The stored analysis rules go to ``shapes.use_stored`` (unless this process built them already)."""
    directory = disk_cache.private_dir(cache_dir)
    raw = disk_cache.read(directory / TABLE_FILE) if directory is not None else None
    if raw is None:
        return None
    try:
        with gc_paused():  # ~60,000 small objects: the collector would walk them again and again
            stored = orjson.loads(raw)
            if stored["format"] != FORMAT or stored["key"] != listing_key():
                return None
            decoder = _Decoder(stored["classes"], stored["nodes"])
            decoder.check()
            decls = _language()
            reaches: dict[tuple[str, ...], frozenset[str]] = {}
            parts: dict[str, list[Family]] = {}
            for module, families in stored["modules"].items():
                parts[module] = [_family(row, decls, decoder, reaches) for row in families]
            analysis = [_rule(decls, decoder, row, reaches) for row in stored["analysis"]]
        shapes.use_stored(analysis)
        return parts
    except Exception:  # a damaged or foreign file only costs building the rules again
        return None


def store(cache_dir: str | Path, parts: dict[str, list[Family]]) -> None:
    """Keep ``parts`` (module name -> families) when every rule refers to the language alone."""
    decls = _language()
    for families in parts.values():
        for fam in families:
            for rules in fam.egg_rules.values():
                if not all(_within(built.__egg_decls__, decls) for _, built in rules):
                    return  # a rule uses a declaration of its own: not stored, built every time
    analysis = shapes.in_tree_rules()
    if not all(_within(built.__egg_decls__, decls) for built in analysis):
        return
    try:
        encoder = _Encoder()
        rows = {module: [_row(fam, encoder) for fam in families] for module, families in parts.items()}
        payload = {
            "format": FORMAT,
            "key": listing_key(),
            "modules": rows,
            "analysis": [_stored(built, encoder) for built in analysis],
            "classes": encoder.classes,
            "nodes": encoder.nodes,
        }
        data = json.dumps(payload, separators=(",", ":"), allow_nan=False).encode()
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


def _row(fam: Family, encoder: _Encoder) -> dict[str, Any]:
    return {
        "name": fam.name,
        "default_off": fam.default_off,
        "names": list(fam.names),
        "rules": {n: [[egg, *_stored(built, encoder)] for egg, built in rules] for n, rules in fam.egg_rules.items()},
        "tolerances": dict(fam.tolerances),
    }


def _family(
    row: dict[str, Any], decls: Declarations, decoder: _Decoder, reaches: dict[tuple[str, ...], frozenset[str]]
) -> Family:
    fam = Family(row["name"], default_off=row["default_off"], tolerances=dict(row["tolerances"]))
    fam.names = list(row["names"])
    fam.egg_rules = {
        n: [(egg, _rule(decls, decoder, rest, reaches)) for egg, *rest in rules] for n, rules in row["rules"].items()
    }
    return fam


def _stored(built: RewriteOrRule, encoder: _Encoder) -> list[Any]:
    """A rule's declaration (its node) with what it reads and writes (``egraph.reach``), so a new
    process need not walk the declaration again."""
    reach = reach_cached(built)
    return [encoder.root(built.decl), sorted(reach.needs), sorted(reach.creates)]


def _rule(
    decls: Declarations, decoder: _Decoder, stored: list[Any], reaches: dict[tuple[str, ...], frozenset[str]]
) -> RewriteOrRule:
    index, needs, creates = stored
    if type(index) is not int or not 0 <= index < len(decoder):
        raise ValueError("a rule names no node")
    built = _StoredRule(decls, decoder, index)
    remember(built, _interned(needs, reaches), _interned(creates, reaches))
    return built


def _interned(names: list[str], seen: dict[tuple[str, ...], frozenset[str]]) -> frozenset[str]:
    """One frozenset per distinct table list (most rules read the same few)."""
    key = tuple(names)
    out = seen.get(key)
    if out is None:
        out = seen[key] = frozenset(key)
    return out
