"""ONNX -> e-graph.

Every node becomes a term: a modelled op through its op-table row (normalized to one
constructor across opset versions), anything else an opaque node that round-trips verbatim.
Shapes and dtypes of leaves come from the model (after ``onnx.shape_inference``); the egglog
analysis computes the rest, and tensors it cannot cover get ONNX's answer, frontier by
frontier, so the two never both claim one tensor unless they agree.
"""

from __future__ import annotations

import functools
import hashlib
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
from egglog import EggSmolError, EGraph
from onnx import helper, numpy_helper

from ..base.errors import TimeLimitError
from ..base.lazy_weights import tensor_array
from ..base.modelio import topological_nodes
from ..base.weightless import infer_types
from . import const_eval
from . import lang as L
from .commands import Commands, Term, int_vec, lit_float, lit_int, lit_string
from .live import live_analysis
from .ops import OPS, OpSpec
from .ops.registry import ImportNode, IntsConst, SplatConst, Unsupported
from .program import OpaqueNode, Program, TensorInfo, TensorRefs
from .reach import Selection, language_symbols, present_symbols, symbol
from .run_cache import run
from .shapes import analysis_ruleset
from .warm import WarmEGraph

SMALL_INTS = 64
"""int64 constants up to this many elements (rank <= 1) become ``Tensor.ints`` that rules read."""


SMALL_SPLAT = 16
"""Uniform constants up to this many elements become ``Tensor.splat`` (rules read their value)."""
_SPLAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16, onnx.TensorProto.INT32}


@functools.lru_cache(maxsize=4096)
def _int_vec(dims: tuple[int, ...]) -> Term:
    """A ``Vec[i64]`` literal (a shape, a small int constant): one command object per distinct value."""
    return int_vec(dims)


class _Symbols:
    """Names <-> negative dim ids; every unnamed unknown dim gets its own fresh id."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.names: dict[int, str] = {}

    def dim(self, d: onnx.TensorShapeProto.Dimension) -> int:
        if d.HasField("dim_value"):
            return int(d.dim_value)
        name = d.dim_param if d.HasField("dim_param") and d.dim_param else f"unk__{len(self.names)}"
        if name not in self.ids:
            self.ids[name] = -(len(self.ids) + 1)
            self.names[self.ids[name]] = name
        return self.ids[name]


def _type_info(tp: onnx.TypeProto, symbols: _Symbols) -> TensorInfo:
    if not tp.HasField("tensor_type"):
        return TensorInfo(None, None)
    tt = tp.tensor_type
    dims = tuple(symbols.dim(d) for d in tt.shape.dim) if tt.HasField("shape") else None
    return TensorInfo(tt.elem_type or None, dims)


_FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}
_SMALL_CHECK_ELEMENTS = 1 << 20
"""Weights up to this many elements are read to tell ``small_const`` (larger ones never are)."""


_TIE_PREFIX = 16
"""Values compared before two weights of one type and shape are hashed to tell whether they are tied."""


def _digest(values: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(values).data).hexdigest()


def _small_magnitude(tensor: onnx.TensorProto, values: np.ndarray) -> bool:
    """Whether a float weight's values all lie within ``L.SMALL_MAGNITUDE`` (large ones: never checked)."""
    if tensor.data_type not in _FLOAT_TYPES or np.prod(tensor.dims) > _SMALL_CHECK_ELEMENTS:
        return False
    return bool(np.all(np.abs(values) <= L.SMALL_MAGNITUDE))  # in its own dtype: 4096 is exact in each; NaN fails


def _constant_tensor(node: onnx.NodeProto) -> onnx.TensorProto | None:
    """The value of a Constant node as a TensorProto (None for sparse values)."""
    attr = node.attribute[0] if node.attribute else None
    if attr is None:
        return None
    if attr.name == "value":
        return attr.t
    value = helper.get_attribute_value(attr)
    kinds = {
        "value_float": np.float32,
        "value_floats": np.float32,
        "value_int": np.int64,
        "value_ints": np.int64,
    }
    if attr.name in kinds:
        return numpy_helper.from_array(np.array(value, dtype=kinds[attr.name]))
    return None


def _outer_names(graph: onnx.GraphProto) -> list[str]:
    """Names a subgraph reads from enclosing scopes (its captured inputs), in first-use order."""
    local = {i.name for i in graph.input} | {i.name for i in graph.initializer}
    found: list[str] = []
    for node in graph.node:
        for name in node.input:
            if name and name not in local and name not in found:
                found.append(name)
        for attr in node.attribute:
            for sub in list(attr.g for _ in [0] if attr.HasField("g")) + list(attr.graphs):
                for name in _outer_names(sub):
                    if name not in local and name not in found:
                        found.append(name)
        local.update(node.output)
    return found


class _Importer:
    def __init__(
        self,
        model: onnx.ModelProto,
        input_shapes: dict[str, list[int]] | None,
        trust_onnx_shapes: bool,
        seed_shapes: bool,
        egraph: EGraph,
        seed_invented: bool = True,
        selection: Selection | None = None,
        deadline: float | None = None,
        static_shapes: Mapping[str, tuple[int, ...]] | None = None,
    ):
        self.model = model
        self.static_shapes = static_shapes or {}
        """Sizes observed where they cannot depend on the data (``onnxsat.static_shapes``)."""
        self.deadline = deadline
        """``time.perf_counter()`` past which the import stops with ``TimeLimitError`` (None: never)."""
        self.node_total = 0
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
        self.egraph = egraph
        self.commands = Commands(egraph)
        """The import's actions, sent as egglog commands (``egraph.commands``)."""
        self.symbols = _Symbols()
        self.infos: dict[str, TensorInfo] = {}
        self.terms: dict[str, Term] = {}
        """Original tensor name -> its ``tensor_ref`` marker term."""
        self.indices: dict[str, int] = {}
        self._known_shaped: set[str] = set()
        self.names: list[str] = []
        self.weights: dict[str, onnx.TensorProto] = {}
        self.weight_prefixes: dict[tuple[int, tuple[int, ...], bytes], dict[str, str | None]] = {}
        """Weights by type, dims and first values, each with its digest once one was needed."""
        self.int_values: dict[str, tuple[int, ...]] = {}
        self.small_values: dict[str, np.ndarray] = {}
        """Values of the small constants (``const_eval``): initializers, Constants and what it evaluated."""
        self.opaque: dict[int, OpaqueNode] = {}
        self.program_unknown: list[str] = []
        self.opaque_reasons: list[str] = []
        self.input_shapes = input_shapes or {}
        self.pending_shapes: list[str] = []
        self.node_meta: dict[str, tuple[str, str, str]] = {}
        self.trust_onnx_shapes = trust_onnx_shapes
        self.seed_shapes = seed_shapes
        self.input_symbols: set[int] = set()
        self.seed_invented = seed_invented
        self.selection = selection

    # ------------------------------------------------------------ helpers
    def _call(self, fn: Any, *args: Term) -> Term:
        return self.commands.call(fn, *args)

    def _bind(self, name: str, expr: Term, *, leaf: bool = False) -> Term:
        """Bind original tensor ``name`` to ``expr`` through its ``tensor_ref`` marker."""
        index = len(self.names)
        self.names.append(name)
        ref = self._call(L.tensor_ref, lit_int(index))
        self.commands.union(ref, expr)
        self.terms[name] = ref
        self.indices[name] = index
        info = self.infos.get(name)
        if info is not None and info.dtype:
            self.commands.set(L.dtype, [ref], lit_int(info.dtype))
        known = info is not None and info.dims is not None and all(d >= 0 for d in info.dims)
        if info is not None and info.dims is not None and (leaf or (known and self.seed_shapes)):
            self.commands.set(L.shape, [ref], _int_vec(tuple(info.dims)))
        elif not leaf:
            self.pending_shapes.append(name)
        return ref

    def _const_term(self, ref: IntsConst | SplatConst) -> Term:
        if isinstance(ref, IntsConst):
            return self._call(L.Tensor.ints, _int_vec(tuple(ref.values)), lit_int(ref.rank))
        return self._splat(float(ref.value), tuple(ref.dims), ref.dtype)

    def _splat(self, value: float, dims: tuple[int, ...], dtype: int) -> Term:
        return self._call(L.Tensor.splat, lit_float(value), _int_vec(dims), lit_int(dtype))

    def _weight(self, name: str) -> Term:
        return self._call(L.Tensor.weight, lit_string(name))

    def _input_term(self, ref: Any) -> Term:
        if ref is None or ref == "":
            return self._call(L.Tensor.none)
        if isinstance(ref, IntsConst | SplatConst):
            return self._const_term(ref)
        return self.terms[ref]

    def _const_ints(self, ref: Any) -> tuple[int, ...] | None:
        if isinstance(ref, IntsConst):
            return ref.values
        if isinstance(ref, str):
            return self.int_values.get(ref)
        return None

    # ------------------------------------------------------------ leaves
    def _add_weight(self, name: str, tensor: onnx.TensorProto) -> None:
        self.infos[name] = TensorInfo(tensor.data_type, tuple(tensor.dims))
        if np.prod(tensor.dims) <= const_eval.MAX_ELEMENTS:
            try:
                self.small_values[name] = tensor_array(tensor)
            except Exception:  # a type numpy cannot hold: not evaluated
                pass
        if tensor.data_type == onnx.TensorProto.INT64 and len(tensor.dims) <= 1 and np.prod(tensor.dims) <= SMALL_INTS:
            values = tuple(int(v) for v in tensor_array(tensor).reshape(-1))
            self.int_values[name] = values
            self._bind(name, self._call(L.Tensor.ints, _int_vec(values), lit_int(len(tensor.dims))), leaf=True)
            return
        if 0 < np.prod(tensor.dims) <= SMALL_SPLAT and tensor.data_type in _SPLAT_TYPES:
            array = tensor_array(tensor)
            flat = array.reshape(-1)
            if np.all(flat == flat[0]) and float(flat[0]) == flat[0]:
                self._bind(name, self._splat(float(flat[0]), tuple(tensor.dims), tensor.data_type), leaf=True)
                return
        read: np.ndarray | None
        try:
            read = tensor_array(tensor)  # read once (from its file when lazy)
        except Exception:  # a type numpy cannot hold: no tying, not small
            read = None
        twin = self._tied_weight(name, tensor, read) if read is not None else None
        if twin is not None:  # weight tying: an equal tensor is the same leaf, so CSE merges its users
            self._bind(name, self._weight(twin), leaf=True)
            return
        self.weights[name] = tensor
        self._bind(name, self._weight(name), leaf=True)
        if read is not None and _small_magnitude(tensor, read):
            self.commands.fact(L.small_const, self._weight(name))

    def _tied_weight(self, name: str, tensor: onnx.TensorProto, values: np.ndarray) -> str | None:
        """An earlier weight with the same type, dims and values, else None (this one is remembered).

        Values are hashed only when an earlier weight of that type and shape starts with the same
        ones: random or trained weights almost never do, so most are read once, not hashed."""
        key = (tensor.data_type, tuple(tensor.dims), values.reshape(-1)[:_TIE_PREFIX].tobytes())
        candidates = self.weight_prefixes.setdefault(key, {})
        if not candidates:
            candidates[name] = None
            return None
        digest = _digest(values)
        for other, other_digest in candidates.items():
            if other_digest is None:
                other_digest = candidates[other] = _digest(tensor_array(self.weights[other]))
            if other_digest == digest:
                return other
        candidates[name] = digest
        return None

    # ------------------------------------------------------------ nodes
    def _import_node(self, index: int, node: onnx.NodeProto) -> None:
        outputs = list(node.output)
        if outputs:
            self.node_meta[outputs[0]] = (node.op_type, node.name, node.doc_string)
        if self._import_evaluated(node):
            return
        if node.domain in ("", "ai.onnx"):
            try:
                if self._import_special(node):
                    return
                spec = OPS.get(node.op_type)
                if spec is not None:
                    self._import_modelled(node, spec)
                    return
                self.program_unknown.append(node.op_type)
            except Unsupported as exc:
                self.opaque_reasons.append(f"{node.op_type}: {exc}")
        else:
            self.program_unknown.append(f"{node.domain}.{node.op_type}")
        self._import_opaque(index, node)

    def _import_evaluated(self, node: onnx.NodeProto) -> bool:
        """A shape computation on small constants (``const_eval``) becomes its values: True when done."""
        if node.op_type not in const_eval.OPS or not all(not i or i in self.small_values for i in node.input):
            return False
        outs = const_eval.evaluate(node, [self.small_values[i] if i else None for i in node.input], self.opset)
        if outs is None:
            return False
        for name, array in zip(node.output, outs, strict=True):
            if name:
                self._add_weight(name, numpy_helper.from_array(array, name))
        return True

    def _used(self, name: str) -> bool:
        return name in self.used_names

    def _import_special(self, node: onnx.NodeProto) -> bool:
        """Constant, ConstantOfShape of a constant, Dropout (inference), Sum: True when handled."""
        op = node.op_type
        if op == "Constant":
            tensor = _constant_tensor(node)
            if tensor is None:
                raise Unsupported("Constant with a sparse or string value")
            self._add_weight(node.output[0], tensor)
            return True
        if op == "ConstantOfShape":
            dims = self._const_ints(node.input[0]) if node.input else None
            if dims is not None and all(d >= 0 for d in dims):
                value, dtype, fill = 0.0, onnx.TensorProto.FLOAT, np.zeros(1, np.float32)
                if node.attribute:
                    fill = numpy_helper.to_array(node.attribute[0].t).reshape(-1)
                    value, dtype = float(fill[0]), node.attribute[0].t.data_type
                self._bind(node.output[0], self._splat(value, tuple(dims), dtype))
                if np.prod(dims) <= const_eval.MAX_ELEMENTS:
                    self.small_values[node.output[0]] = np.full(dims, fill[0], fill.dtype)
                return True
            return False
        if op == "Dropout":
            if len(node.output) > 1 and node.output[1] and self._used(node.output[1]):
                raise Unsupported("Dropout mask is used")
            if len(node.input) > 2 and node.input[2]:
                training = self._const_ints(node.input[2])
                if training is None or any(training):
                    raise Unsupported("Dropout training_mode")
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            if attrs.get("is_test", 1) == 0 and self.opset < 7:
                raise Unsupported("Dropout in training mode")
            self._bind(node.output[0], self._call(L.identity, self.terms[node.input[0]]))
            return True
        if op == "Sum" and node.input:
            if self.opset < 7:  # the Adds it becomes: onnxruntime implements Add from opset 7 only
                raise Unsupported(f"Sum at opset {self.opset}: its Adds would need opset 7")
            acc = self.terms[node.input[0]]
            for name in node.input[1:]:
                acc = self._call(L.add, acc, self.terms[name])
            if len(node.input) == 1:
                acc = self._call(L.identity, acc)
            self._bind(node.output[0], acc)
            return True
        return False

    def _import_modelled(self, node: onnx.NodeProto, spec: OpSpec) -> None:
        if self.opset < spec.min_opset:
            raise Unsupported(f"opset {self.opset} older than modelled ({spec.min_opset})")
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in attrs.items()}
        inputs: list[Any] = [name if name else None for name in node.input]
        infos = [self.infos.get(n) if isinstance(n, str) else None for n in inputs]
        imp = ImportNode(
            op_type=node.op_type,
            inputs=inputs,
            attrs=attrs,
            opset=self.opset,
            input_shapes=[i.dims if i else None for i in infos],
            input_dtypes=[i.dtype if i else None for i in infos],
            n_outputs=len(node.output),
            const_ints=self._const_ints,
        )
        if spec.normalize is not None:
            spec.normalize(imp)
        names = {a.name for a in spec.attrs}
        extra = set(imp.attrs) - names
        if extra:
            raise Unsupported(f"attributes {sorted(extra)} not modelled")
        values = []
        for attr in spec.attrs:
            value = imp.attrs.get(attr.name, attr.default)
            if value is None:
                raise Unsupported(f"attribute {attr.name} missing")
            values.append(_literal(attr.kind, value))
        args = self._input_args(spec, imp.inputs)
        outs = [o for o in node.output]
        if spec.indexed_outputs:
            for i, out in enumerate(outs):
                if out:
                    self._bind(out, self._call(spec.ctor, *args, *values, lit_int(i)))
            return
        if any(o and self._used(o) for o in outs[1:]):
            raise Unsupported("extra outputs are used")
        self._bind(outs[0], self._call(spec.ctor, *args, *values))

    def _tlist(self, items: list[Term]) -> Term:
        """A ``TList`` term (``cons`` cells ending in ``nil``), like ``lang.tlist``."""
        out = self._call(L.TList.nil)
        for item in reversed(items):
            out = self._call(L.TList.cons, item, out)
        return out

    def _input_args(self, spec: OpSpec, inputs: list[Any]) -> list[Term]:
        if spec.variadic:
            return [self._tlist([self._input_term(i) for i in inputs])]
        args = []
        for pos, decl in enumerate(spec.inputs):
            ref = inputs[pos] if pos < len(inputs) else None
            if ref is None and not decl.endswith("?"):
                raise Unsupported(f"required input {decl} missing")
            args.append(self._input_term(ref))
        if len(inputs) > len(spec.inputs):
            raise Unsupported("more inputs than modelled")
        return args

    def _import_opaque(self, index: int, node: onnx.NodeProto) -> None:
        captured: list[str] = []
        for attr in node.attribute:
            subs = ([attr.g] if attr.HasField("g") else []) + list(attr.graphs)
            for sub in subs:
                for name in _outer_names(sub):
                    if name not in captured and name in self.terms:
                        captured.append(name)
        inputs = [self._input_term(n if n else None) for n in node.input] + [self.terms[n] for n in captured]
        self.opaque[index] = OpaqueNode(node, len(node.input), captured)
        args = self._tlist(inputs)
        for i, out in enumerate(node.output):
            if out:
                self._bind(out, self._call(L.opaque, lit_int(index), args, lit_int(i)), leaf=True)

    def _check_deadline(self, imported: int, total: int) -> None:
        if self.deadline is not None and time.perf_counter() > self.deadline:
            raise TimeLimitError(imported, total)

    # ------------------------------------------------------------ analysis
    def _analysis(self) -> Any:
        """The selection's analysis rules that can match now (``egraph.live``), else every one."""
        if self.selection is None:
            return analysis_ruleset()
        return live_analysis(self.selection.analysis_rules, present_symbols(self.egraph))

    def _fill_shapes(self) -> None:
        """Saturate the analysis; give ONNX's answer to tensors it leaves open, frontier first."""
        pending = list(self.pending_shapes)
        while True:
            self._check_deadline(self.node_total, self.node_total)
            run(self.egraph, self._analysis().saturate())  # the report unread: not built in Python
            missing = [n for n in pending if not self._shaped(n)]
            frontier = [n for n in missing if self._inputs_shaped(n)] if self.trust_onnx_shapes else []
            for name in frontier:
                info = self.infos.get(name)
                if info is not None and info.dims is not None and self._seedable(info.dims):
                    self.commands.set(L.shape, [self.terms[name]], _int_vec(tuple(info.dims)))
            if not self.commands.queue:
                return
            self.commands.send()
            done = set(frontier)
            pending = [n for n in missing if n not in done]

    def _seedable(self, dims: tuple[int, ...]) -> bool:
        """Whether ONNX's shape may be given to a tensor the analysis cannot shape yet: every dim
        known or a symbol of a graph input, or (``seed_invented``) any. A symbol ONNX inference
        invents (``unk__3``, or an exporter's name for a computed size) stands for a value a
        rewrite may later let the analysis compute (a Slice end folded to 2): that sound rewrite
        then meets a second shape in the e-class, and the run is repeated without such seeds
        (``onnxsat.pipeline``); seeding them first keeps the rules their shapes enable elsewhere."""
        return self.seed_invented or all(d >= 0 or d in self.input_symbols for d in dims)

    def _inputs_shaped(self, name: str) -> bool:
        producer = self.producers.get(name)
        if producer is None:
            return True
        for inp in producer.input:
            if inp and inp in self.terms and not self._shaped(inp):
                return False
        return True

    def _shaped(self, name: str) -> bool:
        """Whether the analysis has a shape for tensor ``name`` (once it has, it keeps it)."""
        if name in self._known_shaped:
            return True
        if self.commands.lookup(L.shape, self.terms[name]) is None:
            return False
        self._known_shaped.add(name)
        return True

    # ------------------------------------------------------------ driver
    def run(self) -> Program:
        model = self.model = _pin_inputs(self.model, self.input_shapes)
        graph = model.graph
        try:
            inferred = infer_types(model)  # types only: no weight copies
        except Exception:  # inference is advisory: shapes then come from the analysis alone
            inferred = model
        for vi in inferred.graph.input:
            self.infos[vi.name] = _type_info(vi.type, self.symbols)
        self.input_symbols = set(self.symbols.names)
        for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
            self.infos[vi.name] = _type_info(vi.type, self.symbols)
        for name, dims in self.static_shapes.items():
            known = self.infos.get(name)
            if known is not None and known.dtype is not None:
                self.infos[name] = TensorInfo(known.dtype, tuple(dims))
        initializers = {t.name: t for t in graph.initializer}
        input_names = [i.name for i in graph.input]
        overridable = {n for n in input_names if n in initializers and model.ir_version >= 4}
        true_inputs = [n for n in input_names if n not in initializers or n in overridable]
        for name in true_inputs:
            self._bind(name, self._call(L.Tensor.input, lit_string(name)), leaf=True)
        nodes = topological_nodes(graph)
        self.node_total = len(nodes)
        for name, tensor in initializers.items():
            self._check_deadline(0, len(nodes))
            if name not in overridable:
                self._add_weight(name, tensor)
        self.producers = {out: node for node in nodes for out in node.output if out}
        self.used_names = {n for node in nodes for n in node.input} | {o.name for o in graph.output}
        for node in nodes:
            for attr in node.attribute:
                for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                    self.used_names.update(_outer_names(sub))
        for index, node in enumerate(nodes):
            self._check_deadline(index, len(nodes))
            self._import_node(index, node)
        self.commands.set(L.model_opset, [], lit_int(self.opset))  # rules creating ops guard on it
        for k, o in enumerate(graph.output):
            self.commands.union(self._call(L.graph_output, lit_int(k)), self.terms[o.name])
        self.commands.send(between=lambda: self._check_deadline(len(nodes), len(nodes)))
        if self.selection is not None and not present_symbols(self.egraph) <= self.selection.available:
            self.selection = None  # the import wrote a table its selection did not foresee: all rules
        self._fill_shapes()
        from collections import Counter

        return Program(
            egraph=self.egraph,
            model=model,
            opset=self.opset,
            outputs=[(o.name, L.tensor_ref(self.indices[o.name])) for o in graph.output],
            names=self.names,
            weights=self.weights,
            opaque=self.opaque,
            symbols=dict(self.symbols.names),
            true_inputs=true_inputs,
            overridable=overridable,
            node_meta=self.node_meta,
            unknown_ops=Counter(self.program_unknown),
            opaque_reasons=Counter(self.opaque_reasons),
            terms=TensorRefs(self.indices),
            infos=self.infos,
            selection=self.selection,
        )


def _pin_inputs(model: onnx.ModelProto, pins: dict[str, list[int]]) -> onnx.ModelProto:
    """A copy whose inputs declare the pinned shapes (``--input-shape``): the optimized model is
    specialized to them, so it says so, and shape inference sees them."""
    if not pins:
        return model
    pinned = onnx.ModelProto()
    pinned.CopyFrom(model)
    for vi in pinned.graph.input:
        if vi.name in pins:
            shape = vi.type.tensor_type.shape
            del shape.dim[:]
            for d in pins[vi.name]:
                shape.dim.add().dim_value = int(d)
    return pinned


def _literal(kind: str, value: Any) -> Term:
    if kind == "int":
        return lit_int(value)
    if kind == "float":
        return lit_float(value)
    if kind == "string":
        return lit_string(value)
    return _int_vec(tuple(int(v) for v in value))


def from_onnx(
    model: onnx.ModelProto,
    input_shapes: dict[str, list[int]] | None = None,
    *,
    trust_onnx_shapes: bool = True,
    warm: WarmEGraph | None = None,
    seed_invented: bool = True,
    time_limit: float | None = None,
    static_shapes: Mapping[str, tuple[int, ...]] | None = None,
) -> Program:
    """Import a (checked) model into a fresh e-graph with its analyses run.

    Fully known shapes from ONNX shape inference seed the analysis (so a deep network does not
    need one analysis iteration per layer); symbolic ones are computed by the egglog rules. If
    the two ever disagree, the import is redone with the egglog analysis alone.
    ``trust_onnx_shapes=False`` uses the egglog analysis alone and leaves tensors it cannot
    shape without a shape (tests use it to check the analysis against ONNX shape inference).
    ``warm``: import into that reused e-graph (rules already declared, see ``egraph.warm``) instead
    of a new one. ``seed_invented=False``: sizes ONNX inference names but cannot compute
    (``unk__0``) are not seeded (see ``_Importer._seedable``). ``time_limit``: seconds from now
    after which the import of nodes stops with ``TimeLimitError`` (a huge graph within ``--time-limit``).
    ``static_shapes``: sizes known by observation where ONNX inference leaves them open
    (``onnxsat.static_shapes``), seeded like its own.
    """
    deadline = None if time_limit is None else time.perf_counter() + time_limit

    def fresh() -> EGraph:
        return warm.fresh() if warm is not None else EGraph()

    selection = warm.selection if warm is not None else None

    if trust_onnx_shapes:
        try:
            return _Importer(
                model, input_shapes, True, seed_shapes=True, egraph=fresh(), seed_invented=seed_invented,
                selection=selection, deadline=deadline, static_shapes=static_shapes,
            ).run()
        except EggSmolError as exc:
            program = _Importer(
                model, input_shapes, True, seed_shapes=False, egraph=fresh(), seed_invented=seed_invented,
                selection=selection, deadline=deadline, static_shapes=static_shapes,
            ).run()
            program.warnings.append(f"shape analysis disagreed with ONNX shape inference: {exc}".splitlines()[0])
            return program
    return _Importer(
        model, input_shapes, False, seed_shapes=False, egraph=fresh(), selection=selection, deadline=deadline
    ).run()


def import_symbols(model: onnx.ModelProto) -> frozenset[str]:
    """Every table importing ``model`` may fill (``egraph.reach``): each modelled op's constructor, the
    ops ``Sum`` and ``Dropout`` import as, and every table of the language that is not an op (leaves,
    markers, analyses). An over-estimate: a table it leaves out that the import fills anyway makes
    the import fall back to every rule."""
    ctors = {_ctor_symbol(spec) for spec in OPS.values()}
    found = set(_leaf_symbols() - ctors)
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx"):
            continue
        spec = OPS.get(node.op_type)
        if spec is not None:
            found.add(_ctor_symbol(spec))
        if node.op_type in ("Sum", "Dropout"):
            found.update(_ctor_symbol(OPS[op]) for op in ("Add", "Identity"))
    return frozenset(found)


def written_symbols() -> frozenset[str]:
    """The tables of the ops export writes besides the extracted program's (``egraph.exporter``,
    ``egraph.fold``): ConstantOfShape for a uniform constant, Identity for an output that is another
    tensor. A window over exported regions imports them, so a region-wise run declares their rules
    with the whole graph's (one declared e-graph for regions and windows)."""
    return frozenset(_ctor_symbol(OPS[op]) for op in ("ConstantOfShape", "Identity"))


def _ctor_symbol(spec: OpSpec) -> str:
    ctor: Any = spec.ctor
    name = symbol(ctor.__egg_decls__, ctor.__egg_ref__)
    assert name is not None
    return name


@functools.cache
def _leaf_symbols() -> frozenset[str]:
    from egglog.declarations import Declarations

    return language_symbols(Declarations.create(*[v for v in vars(L).values() if hasattr(v, "__egg_decls__")]))
