"""Cost models: what one extracted e-node costs, in estimated microseconds.

A ``CostModel`` prices a node from its op, attributes and the shapes/dtypes of its inputs and
output. ``RooflineCost`` is the analytic default: time = max(FLOPs / peak, bytes / bandwidth)
plus a per-kernel overhead. Weight-only nodes cost nothing (they are folded at export), and
metadata-only layout ops (Reshape, Squeeze, Identity...) cost only a tiny dispatch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ..egraph.ops import BY_CTOR
from ..egraph.ops.registry import CostCtx, numel
from .serialized import ENode, Ref

_ITEMSIZE = {1: 4, 2: 1, 3: 1, 4: 2, 5: 2, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 12: 4, 13: 8, 16: 2}
_VIEW_OPS = {"reshape", "flatten", "squeeze", "unsqueeze", "identity"}


@dataclass(frozen=True)
class NodeCtx:
    """What a cost model sees of one e-node."""

    node: ENode
    out_shape: tuple[int, ...] | None
    out_dtype: int | None
    in_shapes: list[tuple[int, ...] | None]
    in_dtypes: list[int | None]
    is_const: bool


class CostModel(Protocol):
    @property
    def name(self) -> str: ...

    def node_cost(self, ctx: NodeCtx) -> float: ...


@dataclass(frozen=True)
class RooflineCost:
    """Analytic roofline cost of one kernel per node (no fusion credit yet)."""

    name: str = "ort-cpu"
    peak_gflops: float = 50.0
    bandwidth_gbs: float = 10.0
    kernel_overhead_us: float = 2.0
    view_overhead_us: float = 0.2

    def node_cost(self, ctx: NodeCtx) -> float:
        op = ctx.node.op
        if ctx.is_const or op.startswith("Tensor.") or op.startswith("TList."):
            return 0.0
        if op in _VIEW_OPS:
            return self.view_overhead_us
        spec = BY_CTOR.get(op)
        attrs = _named_attrs(ctx.node) if spec is not None else {}
        flops = spec.flops(CostCtx(ctx.in_shapes, ctx.out_shape, attrs)) if spec is not None else 0.0
        bytes_moved = sum(
            numel(s) * _ITEMSIZE.get(d or 1, 4) for s, d in zip(ctx.in_shapes, ctx.in_dtypes, strict=False)
        ) + numel(ctx.out_shape) * _ITEMSIZE.get(ctx.out_dtype or 1, 4)
        compute_us = flops / (self.peak_gflops * 1e3)
        memory_us = bytes_moved / (self.bandwidth_gbs * 1e3)
        return max(compute_us, memory_us) + self.kernel_overhead_us


def _named_attrs(node: ENode) -> dict[str, object]:
    spec = BY_CTOR[node.op]
    literals = [a for a in node.args if not isinstance(a, Ref)]
    return {attr.name: value for attr, value in zip(spec.attrs, literals, strict=False)}


PROFILES: dict[str, CostModel] = {"ort-cpu": RooflineCost(name="ort-cpu")}


def known_dims(shape: tuple[int, ...] | None) -> tuple[int, ...] | None:
    """Symbolic dims priced as 1 (the cost of one batch/sequence element)."""
    if shape is None:
        return None
    return tuple(d if d >= 0 else 1 for d in shape)
