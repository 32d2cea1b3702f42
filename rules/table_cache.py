"""The built in-tree rules on disk, so a new process does not build them again in Python.

Building the in-tree families' ~600 egglog rules and the ~500 analysis rules (``egraph/shape_defs.py``)
from their Python definitions takes seconds; a built rule is a declaration tree (``RuleDecl``) over the
tensor language, which pickles. The file keeps, per rule module, its families with each rule's
declaration, and the analysis rules in order, keyed like the rule
listing (``listing.listing_key``: onnxsat and egglog versions, the rule sources) and checked on
load; any mismatch or error means the rules are built from their modules again. Only the
declarations are stored: egglog still declares the rules into each new e-graph (a saved e-graph
cannot be reloaded with its rules). The PET site-rule modules are always imported (their rules
are Python verifiers, not egglog rules).

The file goes through `onnxsat.base.disk_cache` (a private 0700 directory, a sha256 per entry,
fsync before rename) and is read by an unpickler that builds only egglog's declaration classes:
any other global in the stream (``os.system``, a module's function) is refused, so a planted file
cannot run code; it only costs building the rules again.
"""

from __future__ import annotations

import copyreg
import io
import pickle
from pathlib import Path
from typing import Any

from egglog import RewriteOrRule
from egglog.declarations import CallDecl, Declarations

from onnxsat.base import disk_cache

from ..egraph import lang as L
from ..egraph import shapes
from ..egraph.reach import reach_cached, remember
from .listing import listing_key
from .registry import Family

TABLE_FILE = "rule-table.pickle"

copyreg.pickle(CallDecl, lambda c: (CallDecl, (c.callable, c.args, c.bound_tp_params)))
"""CallDecl pools its instances in ``__new__``; rebuild them through it so the pool stays valid."""


def _language() -> Declarations:
    """Every declaration of the tensor language (what the in-tree rules refer to)."""
    found = [v for v in vars(L).values() if hasattr(v, "__egg_decls__")]
    return Declarations.create(*found, *shapes.TABLES)


class _DeclarationsOnly(pickle.Unpickler):
    """Unpickles egglog declaration classes and plain data, nothing else (no callables, no modules)."""

    def find_class(self, module: str, name: str) -> Any:
        import egglog.declarations as declarations

        obj = getattr(declarations, name, None) if module == "egglog.declarations" else None
        if not isinstance(obj, type):
            raise pickle.UnpicklingError(f"{module}.{name} is not allowed in the rule-table cache")
        return obj


def load(cache_dir: str | Path) -> dict[str, list[Family]] | None:
    """Module name -> its families as stored, or None (no file, another key, damaged or foreign).
    The stored analysis rules go to ``shapes.use_stored`` (unless this process built them already)."""
    directory = disk_cache.private_dir(cache_dir)
    raw = disk_cache.read(directory / TABLE_FILE) if directory is not None else None
    if raw is None:
        return None
    try:
        stored = _DeclarationsOnly(io.BytesIO(raw)).load()
        if stored["key"] != listing_key():
            return None
        decls = _language()
        parts: dict[str, list[Family]] = {}
        for module, families in stored["modules"].items():
            parts[module] = [_family(row, decls) for row in families]
        shapes.use_stored([_rule(decls, row) for row in stored["analysis"]])
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
        data = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
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
