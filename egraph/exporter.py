"""Extracted graph -> ONNX ModelProto at the model's own opset.

Names: graph inputs and outputs keep their names; every other tensor takes the original name
of its e-class (its ``origin``) when free, else a fresh ``onnxsat_<n>``. Untouched nodes keep
their node names and doc strings. Constant subgraphs are folded afterwards (``fold``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..base.lazy_weights import tensor_array
from ..base.modelio import model_shell
from .graph_types import KERNEL_STAMP, STAMP_SEPARATOR, ENode, ExtractedGraph, Ref
from .ops import BY_CTOR
from .ops.registry import ExportNode
from .opset_upgrade import UpgradeError, convert_whole_model, has_placeholders
from .program import Program

MIN_IR_VERSION = 4
"""Constant initializers are not graph inputs from IR 4 on; older models are lifted to 4."""


class ExportError(RuntimeError):
    """An extracted node has no valid ONNX form at the model's opset (a rule bug)."""


def _multi_key(node: ENode) -> tuple[Any, ...] | None:
    """Identity of the multi-output node an e-node is one output of (None for single-output)."""
    if node.op == "opaque":
        return ("opaque", node.args[0])
    spec = BY_CTOR.get(node.op)
    if spec is not None and spec.indexed_outputs:
        return (node.op, node.args[:-1])
    return None


def _renamed(tensor: onnx.TensorProto, name: str) -> onnx.TensorProto:
    copy = onnx.TensorProto()
    copy.CopyFrom(tensor)
    copy.name = name
    return copy


def _attr_value(kind: str, value: Any) -> Any:
    if kind == "ints":
        return [int(v) for v in value]
    return value


class _Exporter:
    def __init__(
        self, program: Program, graph: ExtractedGraph, allow_contrib_ops: bool = False, upgrade_opset: int | None = None
    ):
        self.program = program
        self.graph = graph
        self.allow_contrib_ops = allow_contrib_ops
        self.upgrade_opset = upgrade_opset if upgrade_opset is not None and upgrade_opset > program.opset else None
        self.domains: set[str] = set()
        """Non-default domains the written nodes use (onnxruntime contrib ops)."""
        self.choice = graph.choice()
        self.names: dict[str, str] = {}
        self.used: set[str] = set()
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: dict[str, onnx.TensorProto] = {}
        self.stamps: list[tuple[onnx.NodeProto, list[str]]] = []
        """Written nodes and, per output, the e-class whose result their kernel stores (``graph.kernels``)."""
        self.fresh = 0
        self.output_names = [name for name, _ in program.outputs]
        self.reserved = set(self.output_names) | set(program.true_inputs)
        self.done_multi: set[tuple[Any, ...]] = set()
        self.multi: dict[tuple[Any, ...], dict[int, str]] = {}
        """Multi-output node key -> output index -> e-class (Split parts, opaque outputs)."""
        for eclass, node in graph.nodes:
            key = _multi_key(node)
            if key is not None:
                self.multi.setdefault(key, {}).setdefault(int(node.args[-1]), eclass)

    def _fresh(self, hint: str = "onnxsat") -> str:
        while True:
            self.fresh += 1
            name = f"{hint}_{self.fresh}"
            if name not in self.used and name not in self.reserved and name not in self.program.infos:
                self.used.add(name)
                return name

    def _name_for(self, eclass: str) -> str:
        if eclass in self.names:
            return self.names[eclass]
        node = self.choice[eclass]
        name = None
        if node.op == "Tensor.input":
            name = node.args[0]
        elif node.op == "Tensor.weight" and node.args[0] not in self.used:
            name = node.args[0]
        else:
            origin = self.graph.origins.get(eclass)
            if origin is not None:
                candidate = self.program.names[origin]
                if candidate not in self.used and candidate not in self.reserved:
                    name = candidate
        if name is None:
            name = self._fresh()
        self.used.add(name)
        self.names[eclass] = name
        return name

    def _list_items(self, eclass: str) -> list[str]:
        items = []
        node = self.choice[eclass]
        while node.op == "TList.cons":
            head, tail = node.args
            items.append(head.eclass)
            node = self.choice[tail.eclass]
        return items

    def _input_name(self, eclass: str) -> str:
        node = self.choice[eclass]
        return "" if node.op == "Tensor.none" else self.names[eclass]

    def _const_value(self, eclass: str) -> np.ndarray | None:
        node = self.choice[eclass]
        if node.op == "Tensor.ints":
            values, rank = node.args
            return np.array(values if rank else values[0], dtype=np.int64)
        if node.op == "Tensor.splat":
            value, dims, dt = node.args
            return np.full(dims, value, dtype=helper.tensor_dtype_to_np_dtype(dt))
        if node.op == "Tensor.weight":
            return tensor_array(self.program.weights[node.args[0]])
        return None

    def _folded_value(self, eclass: str, limit: int = 64) -> np.ndarray | None:
        """The value of an e-class computed from constants only, by evaluating the nodes already
        written for it (at most ``limit``); None when it reads a graph input or is larger."""
        value = self._const_value(eclass)
        name = self.names.get(eclass)
        if value is not None or name is None:
            return value
        producers = {out: node for node in self.nodes for out in node.output}
        needed: list[onnx.NodeProto] = []
        seen: set[str] = set()
        stack = [name]
        while stack:
            tensor = stack.pop()
            if tensor in seen or tensor == "" or tensor in self.initializers:
                continue
            seen.add(tensor)
            node = producers.get(tensor)
            if node is None or len(needed) >= limit or node.domain not in ("", "ai.onnx"):
                return None  # a graph input, too large, or an op the reference cannot run
            needed.append(node)
            stack.extend(node.input)
        order = [n for n in self.nodes if any(n is m for m in needed)]
        inits = {i for n in order for i in n.input if i in self.initializers}
        graph = helper.make_graph(
            order, "fold", [], [helper.make_tensor_value_info(name, onnx.TensorProto.UNDEFINED, None)],
            [_renamed(self.initializers[i], i) for i in sorted(inits)],
        )  # fmt: skip
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.program.opset)])
        try:
            from onnx.reference import ReferenceEvaluator

            outputs: list[Any] = list(ReferenceEvaluator(model).run(None, {}))
            return np.asarray(outputs[0])
        except Exception:  # an op the reference does not run: no value
            return None

    # ------------------------------------------------------------ per node
    def _emit(self, eclass: str, node: ENode) -> None:
        op = node.op
        if op.startswith("TList.") or op == "Tensor.none":
            return
        if op == "Tensor.input":
            self._name_for(eclass)
            return
        if op == "Tensor.weight":
            # The program's own proto: copied (and renamed) once, straight into the new model.
            self.initializers[self._name_for(eclass)] = self.program.weights[node.args[0]]
            return
        if op == "Tensor.ints":
            name = self._name_for(eclass)
            self.initializers[name] = numpy_helper.from_array(np.asarray(self._const_value(eclass)), name)
            return
        if op == "Tensor.splat":
            self._emit_splat(eclass, node)
            return
        if op == "opaque":
            self._emit_opaque(eclass, node)
            return
        self._emit_modelled(eclass, node)

    def _emit_splat(self, eclass: str, node: ENode) -> None:
        value, dims, dt = node.args
        name = self._name_for(eclass)
        if int(np.prod(dims, dtype=np.int64)) <= 16:
            array = np.full(dims, value, dtype=helper.tensor_dtype_to_np_dtype(dt))
            self.initializers[name] = numpy_helper.from_array(array, name)
            return
        shape_name = self._fresh(f"{name}_shape")
        self.initializers[shape_name] = numpy_helper.from_array(np.array(dims, dtype=np.int64), shape_name)
        fill = numpy_helper.from_array(np.array([value], dtype=helper.tensor_dtype_to_np_dtype(dt)), "value")
        self.nodes.append(helper.make_node("ConstantOfShape", [shape_name], [name], value=fill))

    def _emit_opaque(self, eclass: str, node: ENode) -> None:
        key, args, _ = node.args
        if ("opaque", key) in self.done_multi:
            return
        self.done_multi.add(("opaque", key))
        info = self.program.opaque[key]
        items = self._list_items(args.eclass)
        inputs = [self._input_name(c) for c in items[: info.n_inputs]]
        for captured, cls in zip(info.captured, items[info.n_inputs :], strict=True):
            have = self.names[cls]
            if have != captured:
                # Subgraphs read this tensor by name: make the name exist.
                self.nodes.append(helper.make_node("Identity", [have], [captured]))
                self.used.add(captured)
        outputs = self._multi_outputs(node, len(info.node.output))
        proto = onnx.NodeProto()
        proto.CopyFrom(info.node)
        del proto.input[:]
        proto.input.extend(inputs)
        del proto.output[:]
        proto.output.extend(outputs)
        self.nodes.append(proto)

    def _multi_outputs(self, node: ENode, count: int) -> list[str]:
        """Names of all outputs of a multi-output node: extracted ones by class, others fresh."""
        by_index = self.multi[_multi_key(node)]  # type: ignore[index]
        return [self._name_for(by_index[i]) if i in by_index else self._fresh() for i in range(count)]

    def _emit_modelled(self, eclass: str, node: ENode) -> None:
        spec = BY_CTOR[node.op]
        refs = [a for a in node.args if isinstance(a, Ref)]
        literals = [a for a in node.args if not isinstance(a, Ref)]
        if spec.variadic:
            input_classes = self._list_items(refs[0].eclass)
        else:
            input_classes = [r.eclass for r in refs]
        if spec.indexed_outputs:
            multi = (node.op, node.args[:-1])
            if multi in self.done_multi:
                return
            self.done_multi.add(multi)
            outputs = self._multi_outputs(node, self._split_count(node, input_classes))
            literals = literals[:-1]
        else:
            outputs = [self._name_for(eclass)]
        attrs = {}
        for attr, value in zip(spec.attrs, literals, strict=True):
            if attr.default is not None and value == attr.default:
                continue  # defaults stay implicit: older opsets may not know the attribute
            attrs[attr.name] = _attr_value(attr.kind, value)
        inputs = [self._input_name(c) for c in input_classes]
        while inputs and inputs[-1] == "":
            inputs.pop()
        exp = ExportNode(
            op_type=spec.op_type,
            inputs=inputs,
            attrs=attrs,
            opset=self.program.opset,
            const_value=lambda i: self._const_value(input_classes[i]) if i < len(input_classes) else None,
            folded_value=lambda i: self._folded_value(input_classes[i]) if i < len(input_classes) else None,
            outputs=outputs,
            fresh=self._fresh,
            in_shape=lambda i: self.graph.shapes.get(input_classes[i]) if i < len(input_classes) else None,
            allow_contrib=self.allow_contrib_ops,
            upgrade_opset=self.upgrade_opset,
        )
        if spec.export is not None:
            try:
                spec.export(exp)
            except Exception as exc:
                raise ExportError(f"{spec.op_type} cannot be written at opset {self.program.opset}: {exc}") from exc
        parts: list[str | None] = [eclass]
        if spec.indexed_outputs:
            parts = [self.multi[_multi_key(node)].get(i) for i in range(len(outputs))]  # type: ignore[index]
        if exp.expansion:  # a fused kind written as its chain of standard ops
            self.nodes.extend(exp.expansion)
            self.domains.update(n.domain for n in exp.expansion if n.domain)
            self._stamp(parts, exp.expansion)
            return
        if exp.domain:
            self.domains.add(exp.domain)
        meta = self.program.node_meta.get(outputs[0])
        proto = helper.make_node(exp.op_type, exp.inputs, exp.outputs, domain=exp.domain or None, **exp.attrs)
        for key, value in exp.metadata.items():
            proto.metadata_props.add(key=key, value=value)
        if meta is not None and meta[0] == exp.op_type:
            proto.name, proto.doc_string = meta[1], meta[2]
        self.nodes.append(proto)
        self._stamp(parts, [proto])

    def _stamp(self, parts: list[str | None], protos: list[onnx.NodeProto]) -> None:
        """Remember the kernel extraction priced ``protos`` in (a fused kind's whole chain is one;
        a Split's parts may each be in another: one per output), written as ``KERNEL_STAMP`` once
        every tensor has its name. Nodes extraction grouped nothing for stay unstamped."""
        roots = [self.graph.kernels.get(part) if part is not None else None for part in parts]
        if roots and all(root is not None for root in roots):
            self.stamps += [(proto, [root for root in roots if root is not None]) for proto in protos]

    def _split_count(self, node: ENode, input_classes: list[str]) -> int:
        if BY_CTOR[node.op].output_count:
            return BY_CTOR[node.op].output_count
        has_sizes = len(input_classes) > 1 and self.choice[input_classes[1]].op != "Tensor.none"
        sizes = self._const_value(input_classes[1]) if has_sizes else None
        if sizes is not None:
            return int(np.asarray(sizes).size)
        return int(node.args[-2])  # num_outputs (import records it for equal splits)

    # ------------------------------------------------------------ model
    def run(self) -> onnx.ModelProto:
        for eclass, node in self.graph.nodes:
            if node.op == "Tensor.input":
                self._name_for(eclass)
        for (name, _), root in zip(self.program.outputs, self.graph.roots, strict=True):
            if root not in self.names and self.choice[root].op not in ("Tensor.weight", "Tensor.none"):
                self.names[root] = name
                self.used.add(name)
        for eclass, node in self.graph.nodes:
            self._emit(eclass, node)
        for proto, roots in self.stamps:
            if all(root in self.names for root in roots):
                proto.metadata_props.add(key=KERNEL_STAMP, value=STAMP_SEPARATOR.join(self.names[root] for root in roots))
        for (name, _), root in zip(self.program.outputs, self.graph.roots, strict=True):
            have = self.names[root]
            if have != name:
                # The same tensor feeds two outputs, or an output is an input/weight.
                self.nodes.append(helper.make_node("Identity", [have], [name]))
        graph_in = {vi.name: vi for vi in self.program.model.graph.input}
        model = self.program.model
        old = model.graph
        new_graph = helper.make_graph(
            self.nodes,
            old.name,
            [graph_in[n] for n in self.program.true_inputs],
            list(old.output),
            doc_string=old.doc_string or None,
        )
        new_model = model_shell(model, {"node", "initializer", "input", "output", "value_info"})
        new_model.graph.CopyFrom(new_graph)
        for name, tensor in self.initializers.items():
            copy = new_model.graph.initializer.add()
            copy.CopyFrom(tensor)
            copy.name = name
        for name in self.program.overridable:
            if name not in self.initializers:
                new_model.graph.initializer.add().CopyFrom(next(t for t in old.initializer if t.name == name))
        new_model.ir_version = max(model.ir_version, MIN_IR_VERSION)
        imported = {o.domain for o in new_model.opset_import}
        for domain in sorted(self.domains - imported):
            new_model.opset_import.append(helper.make_opsetid(domain, 1))
        return new_model


def to_onnx(
    program: Program,
    graph: ExtractedGraph,
    *,
    allow_contrib_ops: bool = False,
    upgrade_opset: int | None = None,
    notes: list[str] | None = None,
) -> onnx.ModelProto:
    """Write an extracted graph as a model with the original's inputs, outputs, opsets and metadata.

    ``allow_contrib_ops`` writes fused kinds as onnxruntime com.microsoft ops (the domain is added to
    the opset imports); otherwise they become their chains of standard ops. ``upgrade_opset``: fused
    kinds that are standard ops at that opset (and not before the model's) are written as those ops,
    with the whole model converted to it; where the converter fails, they are written as they would
    be without it, and why is appended to ``notes``.
    """
    model = _Exporter(program, graph, allow_contrib_ops, upgrade_opset).run()
    if upgrade_opset is None or not has_placeholders(model):
        return model
    try:
        return convert_whole_model(model, upgrade_opset)
    except UpgradeError as exc:
        if notes is not None:
            notes.append(f"opset kept at {program.opset}: {exc}")
        return _Exporter(program, graph, allow_contrib_ops).run()
