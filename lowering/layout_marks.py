"""The layouts extraction chose, read off the exported model before it is lowered.

A ``reorder_nchwc`` e-node is written as an Identity stamped ``LAYOUT_STAMP``. The lowering drops
those Identities (the depthwise conv reading one reads its input instead) and runs exactly the
convs that read one channel-blocked; a model extracted under the ``onnxsat-cpu`` cost model (its
nodes carry ``KERNEL_STAMP``) runs every other depthwise conv flat. A model that did not come
from that extraction carries no choice: the lowering takes ``conv_layout.prefers_blocked``'s.
"""

from __future__ import annotations

import onnx

from onnxsat.egraph.graph_types import KERNEL_STAMP
from onnxsat.egraph.ops.layout import LAYOUT_STAMP, NCHWC


def _meta(node: onnx.NodeProto, key: str) -> str | None:
    return next((p.value for p in node.metadata_props if p.key == key), None)


def read_layout_marks(model: onnx.ModelProto) -> tuple[onnx.ModelProto, frozenset[str] | None]:
    """``model`` without its layout marks, and the outputs of the Convs extraction chose to run
    channel-blocked (None: the model carries no choice)."""
    outputs = {o.name for o in model.graph.output}
    marks = {
        node.output[0]: node.input[0]
        for node in model.graph.node
        if node.op_type == "Identity" and _meta(node, LAYOUT_STAMP) == NCHWC and node.output[0] not in outputs
    }
    if not marks:
        chosen = any(_meta(node, KERNEL_STAMP) is not None for node in model.graph.node)
        return model, frozenset() if chosen else None

    def source(tensor: str) -> str:
        while tensor in marks:
            tensor = marks[tensor]
        return tensor

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    kept: list[onnx.NodeProto] = []
    blocked: set[str] = set()
    for node in copy.graph.node:
        if node.op_type == "Identity" and node.output and node.output[0] in marks:
            continue
        for i, tensor in enumerate(node.input):
            if tensor in marks:
                node.input[i] = source(tensor)
                if node.op_type == "Conv" and i == 0:
                    blocked.add(node.output[0])
        kept.append(node)
    del copy.graph.node[:]
    copy.graph.node.extend(kept)
    return copy, frozenset(blocked)
