"""Rule plugins: the public rule-authoring API, plugin loading, and verification before use.

A plugin is a Python module exposing a ``RulePlugin`` (as ``PLUGIN``, or any object an entry
point names): named rewrite rules over onnxsat's tensor language, their metadata, and optional
new op rows. Plugins come from the entry-point group ``onnxsat.rules`` (loaded once, lazily)
and from ``--rules path/to/file.py``. Every plugin rule is verified with the same verifier as
the in-tree rules before it may join a run's rule table; an unsound one is rejected with its
counterexample and the run goes on without it (``strict`` makes that an error). A plugin is
loaded and verified once per process, but what it adds is scoped to the runs that ask for it:
its rules join a copy of the in-tree table (``run_table``) and its op rows are in the op table
only while such a run lasts (``plugin_ops``). Verdicts are
cached on disk, keyed by a hash of the rule's text, so a plugin is verified once, not per run.
docs/plugins.md is the user guide; everything here not in ``__all__`` is internal.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

from egglog import RewriteOrRule, Ruleset, String, Vec, eq, f64, i64, rule, set_, var
from egglog.declarations import BiRewriteDecl, EqDecl, RewriteDecl, RuleDecl, UnboundVarDecl, UnionDecl

from onnxsat.base import disk_cache
from onnxsat.base.errors import OnnxsatError
from onnxsat.base.options import Options

from ..egraph import lang as L
from ..egraph.graph_types import CHOICE_OPS
from ..egraph.ops import BY_CTOR, OPS, OpSpec, ctor_name
from ..egraph.shapes import add_rules
from .listing import ENTRY_POINT_GROUP
from .registry import Family, RuleTable, rewrite_rule

__all__ = [
    "ENTRY_POINT_GROUP",
    "PluginError",
    "PluginLoad",
    "PluginWarning",
    "RulePlugin",
    "ensure_plugins",
    "load_plugins",
    "load_plugin",
    "plugin_messages",
    "plugin_ops",
    "rule_source",
    "run_table",
    "unload_plugin",
]

IN_TREE = "in-tree"
CACHE_FILE = "plugin-verification.json"
VERIFY_SETTINGS = {"seeds": 3, "min_instances": 5, "max_candidates": 300, "seed": 0}
"""The verifier's budget for plugin rules: the defaults of ``onnxsat rules verify``."""

ShapeRule = Literal["same-as-input"]
_ATTR_SORTS: dict[str, type] = {"int": i64, "float": f64, "string": String, "ints": Vec[i64]}


class PluginError(OnnxsatError):
    """A plugin failed to load or a rule of it was rejected, under ``strict`` (exit status 2)."""

    exit_code = 2


class PluginWarning(UserWarning):
    """A plugin failed to load or a rule of it was rejected; the run goes on without it."""


# ---------------------------------------------------------------- the authoring API
@dataclass
class RulePlugin:
    """What a plugin provides: named rules (kept in its own table until verified) and op rows.

    ``family`` is the default family of its rules (so ``--disable-rules <family>`` switches the
    plugin off); rule names are stable, kebab-case and unique across onnxsat.
    """

    name: str
    description: str = ""
    family: str = "plugin"
    table: RuleTable = field(default_factory=RuleTable)
    descriptions: dict[str, str] = field(default_factory=dict)
    ops: list[tuple[OpSpec, ShapeRule | tuple[RewriteOrRule, ...]]] = field(default_factory=list)

    def rewrite(
        self,
        name: str,
        lhs: L.Tensor,
        rhs: L.Tensor,
        *guards: Any,
        family: str | None = None,
        description: str = "",
        variant: str = "",
        rtol: float | None = None,
    ) -> None:
        """Add ``lhs => rhs`` under ``guards`` (egglog facts; ``onnxsat.rules.registry.ROOT`` is the match).

        ``rtol``: the relative error verification allows, for results that differ from the matched
        term by float32 rounding of a constant (e.g. a fused op's float attribute); default exact.
        """
        rewrite_rule(self.table, family or self.family, name, lhs, rhs, *guards, variant=variant, rtol=rtol)
        self._describe(name, description)

    def rule(
        self, name: str, built: RewriteOrRule, *, family: str | None = None, description: str = ""
    ) -> None:
        """Add one egglog ``rewrite(...).to(...)`` or ``rule(...).then(union(...))`` under ``name``."""
        for variant, converted in _as_rules(built):
            egg_name = f"{name}{'/' + variant if variant else ''}"
            self.table.add(family or self.family, name, _renamed(converted, egg_name), egg_name)
        self._describe(name, description)

    def ruleset(self, rules: Ruleset, *, family: str | None = None, prefix: str | None = None) -> None:
        """Add every rule of an egglog ruleset (the ``@ruleset.register`` generator style).

        A rule keeps its ``rule(..., name=...)`` name; unnamed ones are ``<prefix>-<n>``
        (``prefix`` defaults to the ruleset's name).
        """
        decls = rules._update_egg_decls()  # egglog-version specific: runs the deferred generators
        stem = prefix or str(rules.__egg_ident__.name)
        for n, decl in enumerate(list(rules.__egg_ruleset__.rules), start=1):
            name = decl.name if isinstance(decl, RuleDecl) and decl.name else f"{stem}-{n}"
            self.rule(name, RewriteOrRule(decls, decl), family=family)

    def op(self, spec: OpSpec, shape: ShapeRule | Sequence[RewriteOrRule] = "same-as-input") -> None:
        """Add an op row: constructor, ONNX mapping and FLOPs in ``spec``; ``shape`` its shape rule.

        ``"same-as-input"`` gives the output the shape and dtype of input 0 (elementwise ops);
        otherwise pass egglog rules that ``set_`` ``shape(t)`` and ``dtype(t)``. Reference
        semantics come from ``onnx.reference`` on the exported node, so ``spec.op_type`` must be
        an ONNX op (or one of a domain the reference knows).
        """
        self.ops.append((spec, shape if isinstance(shape, str) else tuple(shape)))

    def _describe(self, name: str, description: str) -> None:
        if description or name not in self.descriptions:
            self.descriptions[name] = description


def _as_rules(built: RewriteOrRule) -> list[tuple[str, RewriteOrRule]]:
    """egglog rewrites as the ``rule(eq(t).to(lhs)).then(union(t).with_(rhs))`` form the verifier reads."""
    decl, decls = built.decl, built.__egg_decls__
    if isinstance(decl, RuleDecl):
        return [("", built)]
    if isinstance(decl, RewriteDecl) and decl.subsume:
        raise ValueError("subsuming rewrites are not supported in plugins (they delete the matched term)")
    if isinstance(decl, RewriteDecl | BiRewriteDecl):
        root = UnboundVarDecl("plugin_root")
        pairs = [("", decl.lhs, decl.rhs)]
        if isinstance(decl, BiRewriteDecl):
            pairs = [("fwd", decl.lhs, decl.rhs), ("bwd", decl.rhs, decl.lhs)]
        return [
            (
                variant,
                RewriteOrRule(
                    decls,
                    RuleDecl(
                        (UnionDecl(decl.tp, root, rhs),), (EqDecl(decl.tp, root, lhs), *decl.conditions), None
                    ),
                ),
            )
            for variant, lhs, rhs in pairs
        ]
    raise ValueError(f"not a rule or rewrite: {type(decl).__name__}")


def _renamed(built: RewriteOrRule, egg_name: str) -> RewriteOrRule:
    decl = built.decl
    assert isinstance(decl, RuleDecl)
    return RewriteOrRule(built.__egg_decls__, RuleDecl(decl.head, decl.body, egg_name))


# ---------------------------------------------------------------- op rows
def _ctor_vars(spec: OpSpec) -> tuple[list[Any], list[Any]]:
    """Fresh pattern variables for every constructor argument: (all arguments, tensor inputs)."""
    tag = spec.name
    if spec.variadic:
        tensors: list[Any] = [var(f"plugin_items_{tag}", L.TList)]
    else:
        tensors = [var(f"plugin_in{k}_{tag}", L.Tensor) for k in range(len(spec.inputs))]
    args = tensors + [var(f"plugin_{a.name}_{tag}", _ATTR_SORTS[a.kind]) for a in spec.attrs]
    if spec.indexed_outputs:
        args.append(var(f"plugin_index_{tag}", i64))
    return args, tensors


def _op_rules(spec: OpSpec, shape: ShapeRule | tuple[RewriteOrRule, ...]) -> list[RewriteOrRule]:
    """The analysis rules of an op row: its shape/dtype rule and constness (as shapes.py does in-tree)."""
    args, tensors = _ctor_vars(spec)
    t = var(f"plugin_out_{spec.name}", L.Tensor)
    facts = [L.list_const(tensors[0])] if spec.variadic else [L.is_const(v) for v in tensors]
    out = [rule(eq(t).to(spec.ctor(*args)), *facts).then(L.is_const(t))]
    if shape == "same-as-input":
        if spec.variadic or not tensors:
            raise ValueError(f"{spec.op_type}: 'same-as-input' needs a first tensor input")
        dims, dt = var(f"plugin_dims_{spec.name}", Vec[i64]), var(f"plugin_dt_{spec.name}", i64)
        term = eq(t).to(spec.ctor(*args))
        out.append(rule(term, L.shape(tensors[0]) == dims).then(set_(L.shape(t)).to(dims)))
        out.append(rule(term, L.dtype(tensors[0]) == dt).then(set_(L.dtype(t)).to(dt)))
    elif isinstance(shape, str):
        raise ValueError(
            f"{spec.op_type}: unknown shape rule {shape!r} (use 'same-as-input' or egglog rules)"
        )
    else:
        out.extend(shape)
    return out


_ANALYSED: set[int] = set()
"""Op rows whose analysis rules were added to the analysis (``shapes.add_rules``) (once per process: they match only
terms of the op, which nothing builds while the row is out of the op table)."""


def _install_op(spec: OpSpec, shape: ShapeRule | tuple[RewriteOrRule, ...]) -> bool:
    """Add the row to the op table and its rules to the analysis; False if it was already there."""
    known = OPS.get(spec.op_type)
    if known is not None:
        if known is spec:
            return False
        raise ValueError(f"op {spec.op_type} is already modelled ({ctor_name(known.ctor)})")
    if id(spec) not in _ANALYSED:
        add_rules(*_op_rules(spec, shape))
        _ANALYSED.add(id(spec))
    OPS[spec.op_type] = spec
    BY_CTOR[spec.name] = spec
    CHOICE_OPS.add(spec.name)
    return True


def _uninstall_op(spec: OpSpec) -> None:
    """Remove the row (its analysis rules stay but can no longer match: nothing builds the op)."""
    if OPS.get(spec.op_type) is spec:
        del OPS[spec.op_type]
        BY_CTOR.pop(spec.name, None)
        CHOICE_OPS.discard(spec.name)


@contextmanager
def plugin_ops(loads: Sequence[PluginLoad]) -> Iterator[None]:
    """The op rows of ``loads`` in the op table for one run (import, rewrite, export, verify), and
    out of it again afterwards, so a later run without these plugins imports those ops as unknown."""
    installed: list[OpSpec] = []
    try:
        for load in loads:
            for spec, shape in load.plugin.ops if load.plugin else []:
                if spec.op_type in load.ops and _install_op(spec, shape):
                    installed.append(spec)
        yield
    finally:
        for spec in installed:
            _uninstall_op(spec)


# ---------------------------------------------------------------- loading
@dataclass
class PluginLoad:
    """What loading one plugin did: accepted rules, rejected ones (with why), or a load error."""

    source: str
    """``entry point NAME`` or the file path."""
    plugin: RulePlugin | None = None
    accepted: list[str] = field(default_factory=list)
    rejected: dict[str, str] = field(default_factory=dict)
    """Rule name -> reason (the verifier's detail and rendered counterexample)."""
    error: str | None = None
    ops: list[str] = field(default_factory=list)
    """op types this plugin adds to the op table (in runs that use it, see ``plugin_ops``)."""
    families: list[Family] = field(default_factory=list)
    """The accepted rules, by family (what ``run_table`` adds to a run's table)."""

    def messages(self) -> list[str]:
        """One line per problem, naming the plugin and the rule (for warnings and reports)."""
        if self.error is not None:
            return [f"plugin {self.source} not loaded: {self.error}"]
        label = self.plugin.name if self.plugin else self.source
        return [f"plugin {label} rule {n} rejected: {why}" for n, why in self.rejected.items()]


_LOADED: dict[str, PluginLoad] = {}
"""Source -> load result; a source is loaded (and its rules verified) once per process."""
_ENTRY_POINT_LOADS: list[PluginLoad] | None = None
"""The installed plugins' loads, once looked up."""


def rule_source(name: str, table: RuleTable | None = None) -> str:
    """``in-tree``, or ``plugin NAME (SOURCE)`` for a plugin rule of ``table`` (a run's table)."""
    return (table or RuleTable.default()).source_of(name)


def run_table(loads: Sequence[PluginLoad]) -> RuleTable:
    """The rule table of a run using ``loads``: the in-tree table, or a copy of it extended by the
    plugins' accepted rules (the in-tree table itself never changes, so other runs do not see them)."""
    added = [(fam, _label(load)) for load in loads for fam in load.families]
    return RuleTable.default().with_rules(added) if added else RuleTable.default()


def _label(load: PluginLoad) -> str:
    return f"plugin {load.plugin.name if load.plugin else '?'} ({load.source})"


def _plugin_of(obj: Any, source: str) -> RulePlugin:
    """An entry point's object (or a module's ``PLUGIN``) as a ``RulePlugin``; callables are called once."""
    if callable(obj) and not isinstance(obj, RulePlugin):
        obj = obj()
    if not isinstance(obj, RulePlugin):
        raise TypeError(f"{source} gives a {type(obj).__name__}, not an onnxsat RulePlugin")
    return obj


def _module_from_file(path: Path) -> Any:
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
    module_name = f"onnxsat_rules_file_{path.stem}_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    return module


def load_plugin(
    source: str,
    get: Callable[[], Any],
    *,
    strict: bool = False,
    verify: bool = True,
    cache_dir: str | Path | None = None,
) -> PluginLoad:
    """Import one plugin via ``get``, install its op rows, verify its rules, add the sound ones.

    Problems become warnings (and entries of the result) unless ``strict``, where they raise
    ``PluginError``. ``verify=False`` adds rules unverified (tests of the loader only).
    """
    if source in _LOADED:
        return _LOADED[source]
    load = PluginLoad(source)
    try:
        load.plugin = _plugin_of(get(), source)
        for spec, shape in load.plugin.ops:
            if _install_op(spec, shape):
                load.ops.append(spec.op_type)
        _admit(load, load.plugin, verify=verify, cache_dir=cache_dir)
    except Exception as exc:  # a broken plugin must not stop the run
        load.error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".rstrip(": ")
        load.families.clear()
        _undo_ops(load)
    else:
        _undo_ops(load, keep_names=True)  # in the op table only while verifying; runs use plugin_ops
    _LOADED[source] = load
    for text in load.messages():
        warnings.warn(text, PluginWarning, stacklevel=2)
    _raise_if_strict([load], strict)
    return load


def _raise_if_strict(loads: list[PluginLoad], strict: bool) -> None:
    problems = [text for load in loads for text in load.messages()]
    if strict and problems:
        raise PluginError(problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))


def _undo_ops(load: PluginLoad, *, keep_names: bool = False) -> None:
    for spec, _ in load.plugin.ops if load.plugin else []:
        if spec.op_type in load.ops:
            _uninstall_op(spec)
    if not keep_names:
        load.ops.clear()


def _admit(load: PluginLoad, plugin: RulePlugin, *, verify: bool, cache_dir: str | Path | None) -> None:
    """Verify the plugin's rules; the sound ones go to ``load.families`` (not to any shared table)."""
    in_tree = RuleTable.default()
    taken = {n for other in _LOADED.values() for fam in other.families for n in fam.names}
    clashes = [
        n for n in plugin.table.names() if n in in_tree.egg_rules or n in in_tree.families or n in taken
    ]
    for name in clashes:
        load.rejected[name] = "a rule or family of that name already exists"
    candidates = [n for n in plugin.table.names() if n not in clashes]
    verdicts = _verify(plugin.table, candidates, cache_dir) if verify else {}
    families: dict[str, Family] = {}
    for name in candidates:
        verdict = verdicts.get(name)
        if verdict is not None and not verdict["ok"]:
            load.rejected[name] = _reason(verdict)
            continue
        family_name = plugin.table.family_of(name) or plugin.family
        family = families.setdefault(family_name, Family(family_name))
        for egg_name, built in plugin.table.egg_rules[name]:
            family.add(name, built, egg_name)
        if name in plugin.table.tolerances:
            family.tolerances[name] = plugin.table.tolerances[name]
        load.accepted.append(name)
    load.families = list(families.values())


def _reason(verdict: dict[str, Any]) -> str:
    cex = verdict.get("counterexample")
    if not cex:
        return str(verdict["detail"])
    err = cex.get("max_abs_err")
    err_text = "inf" if err is None else f"{err:.3g}"
    leaves = ", ".join(f"{k}: {v}" for k, v in cex["leaves"].items())
    return (
        f"{verdict['detail']}; instance {cex['instance']} with {leaves}: "
        f"{cex['term_a']} != {cex['term_b']} (max abs error {err_text})"
    )


# ---------------------------------------------------------------- verification with a cache
def _rule_key(table: RuleTable, name: str) -> str:
    """Hash of what decides a verdict: the rule's text and tolerance, the op table, the verifier, versions."""
    from .verification.verify import describe_rule

    text = describe_rule(table, name)
    ops = sorted(
        (s.op_type, s.name, s.inputs, tuple(a.name for a in s.attrs), s.min_opset) for s in OPS.values()
    )
    versions = [metadata.version(d) for d in ("onnxsat", "egglog", "onnx")] if _installed() else []
    rtol = table.tolerances.get(name)
    payload = json.dumps([text, rtol, ops, VERIFY_SETTINGS, versions], sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()


def _installed() -> bool:
    try:
        metadata.version("onnxsat")
    except metadata.PackageNotFoundError:
        return False
    return True


def _verify(table: RuleTable, names: list[str], cache_dir: str | Path | None) -> dict[str, dict[str, Any]]:
    """Verdicts (``RuleVerification.to_dict()``) for ``names``, from the cache or the verifier."""
    from .verification.verify import RuleVerifier

    cache = _read_cache(cache_dir)
    keys = {n: _rule_key(table, n) for n in names}
    out = {n: cache[k] for n, k in keys.items() if k in cache}
    todo = [n for n in names if n not in out]
    if todo:
        verifier = RuleVerifier(table, **VERIFY_SETTINGS)
        for name in todo:
            out[name] = verifier.verify(name).to_dict()
            cache[keys[name]] = out[name]
        _write_cache(cache_dir, cache)
    return out


def _read_cache(cache_dir: str | Path | None) -> dict[str, Any]:
    """Verdicts from the cache file (checksummed JSON in a private directory; never unpickled)."""
    directory = disk_cache.private_dir(cache_dir) if cache_dir is not None else None
    raw = disk_cache.read(directory / CACHE_FILE) if directory is not None else None
    if raw is None:
        return {}  # missing or damaged: verify again
    try:
        data = json.loads(raw.decode("utf-8"))
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _write_cache(cache_dir: str | Path | None, cache: dict[str, Any]) -> None:
    """Atomic write; a cache that cannot be written only costs a re-verification next time."""
    directory = disk_cache.private_dir(cache_dir) if cache_dir is not None else None
    if directory is None:
        return
    try:
        payload = json.dumps(cache, sort_keys=True, default=str).encode("utf-8")
    except (ValueError, TypeError) as exc:
        warnings.warn(f"plugin verification cache not written: {exc}", stacklevel=3)
        return
    if not disk_cache.write(directory / CACHE_FILE, payload):
        warnings.warn(f"plugin verification cache not written to {directory}", stacklevel=3)


# ---------------------------------------------------------------- entry points and files
def _entry_points() -> Iterable[metadata.EntryPoint]:
    return metadata.entry_points(group=ENTRY_POINT_GROUP)


def ensure_plugins(
    files: Sequence[str] = (),
    *,
    entry_points: bool = True,
    strict: bool = False,
    cache_dir: str | Path | None = None,
) -> list[PluginLoad]:
    """Load the installed plugins (looked up once per process) and ``files`` (each once).

    Returns the loads of the installed plugins and of ``files``; with ``strict``, any plugin that
    failed to load or any rejected rule among them raises ``PluginError``. ``cache_dir`` also keeps
    the built in-tree rules between processes (``table_cache``).
    """
    global _ENTRY_POINT_LOADS
    RuleTable.default(cache_dir)  # the in-tree rules first (read from ``cache_dir`` when it has them)
    loads: list[PluginLoad] = []
    if entry_points:
        if _ENTRY_POINT_LOADS is None:
            _ENTRY_POINT_LOADS = [
                load_plugin(f"entry point {ep.name}", ep.load, cache_dir=cache_dir)
                for ep in sorted(_entry_points(), key=lambda e: e.name)
            ]
        loads.extend(_ENTRY_POINT_LOADS)
    for file in files:
        path = Path(file)
        if not path.is_file():  # named by the user: an error even when other problems are warnings
            raise PluginError(f"--rules {file}: no such file")

        def get(path: Path = path) -> Any:
            module = _module_from_file(path)
            if not hasattr(module, "PLUGIN"):
                raise AttributeError(f"{path} defines no PLUGIN (an onnxsat RulePlugin)")
            return module.PLUGIN

        loads.append(load_plugin(str(path.resolve()), get, cache_dir=cache_dir))
    _raise_if_strict(loads, strict)
    return loads


def unload_plugin(load: PluginLoad) -> None:
    """Forget a load (tests; a later load of the source imports and verifies it again)."""
    _undo_ops(load)
    _LOADED.pop(load.source, None)


def _reset_entry_points() -> None:
    """Let the next ``ensure_plugins`` look up the installed plugins again (tests)."""
    global _ENTRY_POINT_LOADS
    for load in _ENTRY_POINT_LOADS or []:
        unload_plugin(load)
    _ENTRY_POINT_LOADS = None


def plugin_summary(loads: Sequence[PluginLoad]) -> list[str]:
    """One line per plugin of ``loads`` (code that ran in this process), for the report."""
    lines = []
    for load in loads:
        name = load.plugin.name if load.plugin is not None else "?"
        state = f"not loaded: {load.error}" if load.error else f"{len(load.accepted)} rule(s)"
        lines.append(f"{name} ({load.source}): {state}")
    return lines


def load_plugins(options: Options) -> tuple[RuleTable, list[PluginLoad]]:
    """Load the plugins ``options`` asks for: the run's rule table and the loads (their op rows go
    in with ``plugin_ops``, their problems in the report with ``plugin_messages``)."""
    loads = ensure_plugins(
        options.rule_files,
        entry_points=options.entry_point_plugins,
        strict=options.strict_plugins,
        cache_dir=options.plugin_cache_dir,
    )
    return run_table(loads), loads


def plugin_messages(loads: Sequence[PluginLoad]) -> list[str]:
    """One line per plugin or rule left out (for the report)."""
    return [text for load in loads for text in load.messages()]
