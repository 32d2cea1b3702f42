"""Cost models: what one extracted e-node costs, in estimated microseconds.

A ``CostModel`` prices a node from its op, attributes and the shapes/dtypes of its inputs and
output. ``RooflineCost`` is the analytic default: per op class (matmul, conv, elementwise, ...)
time = overhead + max(FLOPs / peak, bytes / bandwidth), the bandwidth dropping to a spill rate
for kernels larger than the per-core cache, with the constants per class taken from a profile
(built in, or measured by ``onnxsat calibrate``, see ``profile.py``).
Weight-only nodes cost nothing (they are folded at export), and metadata-only layout ops
(Reshape, Squeeze, Identity...) cost only the "view" class overhead.

With ``fusion="ort"`` (the ``ort-cpu`` target) the model prices what onnxruntime will actually
run: nodes that ORT's graph optimizer fuses into their producer (Conv+BatchNorm/Add/Mul/
activation, MatMul+bias into Gemm, Gemm+activation, Transpose pairs, decomposed GELU and
LayerNorm) run no kernel of their own (``FUSED_NODE_US``), because the fused kernel makes one
memory pass where the producer already writes its output. Whether a producer is fusable is judged
from the ops its input e-class holds (``NodeCtx.in_ops``), since per-node costs cannot see which
node extraction picks there. The ``ort`` mode also prices the NCHWc layout ORT runs convs in: the
ReorderOutput copy a consumer that cannot read the blocked layout needs, the ReorderInput of a
conv reading a Split's part, and the slower kernel of a conv whose channels do not fill the block.

With ``fusion="onnxsat"`` (the ``onnxsat-cpu`` target) it prices what ``onnxsat.compile`` runs:
the lowering's partitioner computes elementwise and layout nodes inside the kernel that consumes
them (``lowering.partition``), and a conv's or product's activation and bias in its store, so
such a node costs its FLOPs and the reads of the stored tensors it takes in (weights, graph
inputs, the outputs of other kernels), with no kernel and no pass over its own output
(``onnxsat_inlined_us``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

from ..egraph.graph_types import ENode, Ref
from ..egraph.ops import BY_CTOR
from ..egraph.ops.registry import CostCtx, numel
from .conv_algorithm import winograd_tile, winograd_work
from .conv_layout import can_run_blocked, flat_lane_waste

_ITEMSIZE = {1: 4, 2: 1, 3: 1, 4: 2, 5: 2, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 12: 4, 13: 8, 16: 2}
VIEW_OPS = frozenset({"reshape", "flatten", "squeeze", "unsqueeze", "identity", "shape_of"})

FUSION_MODES = ("none", "ort", "onnxsat")
"""``RooflineCost.fusion``: which runtime's fusions the costs price."""
OP_CLASSES = ("matmul", "conv", "depthwise", "winograd", "elementwise", "reduce", "layout", "split", "transpose", "pool", "view")
"""Op classes with their own constants; ops outside them (opaque) use ``default``."""

PARENT_CLASS = {"split": "layout", "transpose": "layout", "depthwise": "conv", "winograd": "conv"}
"""Classes split off a broader one (a profile without them prices their ops as the broader class):
Split hands over several outputs per kernel, a strided Transpose runs slower per byte than the
contiguous copies of Concat, and a depthwise conv is bound by memory where a dense one is bound
by FLOPs (one roofline for both fitted the dense convs' rate at half what large ones reach). On
the ``onnxsat-cpu`` target the convs onnxsat's kernels run as Winograd (small products between two
memory-bound transforms) have a class of their own: fitted as implicit GEMMs, ResNet-18 was
predicted 1.34-1.42x its measured time, 0.99-1.25x (over calibration runs) with their own roofline."""

_FAMILY_CLASS = {
    "matmul": "matmul",
    "gemm": "matmul",
    "conv": "conv",
    "unary": "elementwise",
    "binary": "elementwise",
    "ternary": "elementwise",
    "reduce": "reduce",
    "pool": "pool",
    "layout": "layout",
    "shape": "elementwise",
}
_OP_CLASS_OVERRIDES = {
    "split": "split",
    "transpose": "transpose",
    "softmax": "reduce",
    "layer_norm": "reduce",
    "fused_rms_norm": "reduce",
    "fused_skip_rms_norm": "reduce",
    "lrn": "reduce",
    "batch_norm": "elementwise",
}

# ORT graph-optimizer fusions (onnxruntime/core/optimizer): producer ops each consumer folds into.
_ACTIVATIONS = frozenset({"relu", "leaky_relu", "clip", "sigmoid", "tanh"})
_CONV_LIKE = frozenset({"conv", "batch_norm"})
"""Producers that end in a conv kernel: ORT folds a BatchNorm into the conv before it fuses the
activation or Add after it (Conv -> BatchNorm -> Relu runs as one kernel)."""
_GEMM_LIKE = frozenset({"gemm"})
_MATMUL_LIKE = frozenset({"matmul", "gemm"})


def node_class(op: str, in_shapes: list[tuple[int, ...] | None]) -> str:
    """The cost class of an e-node: its op's (``op_class``), a conv with one input channel per
    group being ``depthwise``."""
    cls = op_class(op)
    if cls == "conv" and is_depthwise(in_shapes):
        return "depthwise"
    return cls


def is_depthwise(in_shapes: list[tuple[int, ...] | None]) -> bool:
    """A conv whose every group reads one input channel (weights ``[C_out, 1, kh, kw]``, more than one
    input channel)."""
    x, w = (in_shapes + [None, None])[:2]
    return x is not None and w is not None and len(x) > 1 and len(w) > 1 and w[1] == 1 and x[1] > 1


def op_class(op: str) -> str:
    """The cost class of an e-node op (``default`` for ops the table does not model)."""
    if op in VIEW_OPS:
        return "view"
    if op in _OP_CLASS_OVERRIDES:
        return _OP_CLASS_OVERRIDES[op]
    spec = BY_CTOR.get(op)
    if spec is None:
        return "default"
    return _FAMILY_CLASS.get(spec.family, "default")


@dataclass(frozen=True)
class NodeCtx:
    """What a cost model sees of one e-node."""

    node: ENode
    out_shape: tuple[int, ...] | None
    out_dtype: int | None
    in_shapes: list[tuple[int, ...] | None]
    in_dtypes: list[int | None]
    is_const: bool
    in_ops: tuple[frozenset[str], ...] = ()
    """Per input: the ops of every node in its e-class (what ORT might fuse this node into)."""
    in_const: tuple[bool, ...] = ()
    """Per input: computable from weights alone."""


class CostModel(Protocol):
    @property
    def name(self) -> str: ...

    def node_cost(self, ctx: NodeCtx) -> float: ...


@dataclass(frozen=True)
class ClassConstants:
    """Roofline constants of one op class: time = overhead + max(flops / peak, memory time) (or
    their sum, ``additive``).

    Memory time has two regimes: a kernel whose bytes fit in ``cache_bytes`` (the per-core cache
    it runs from when called again) moves them at ``bandwidth_gbs``; a larger one streams all of
    them from the shared cache levels or DRAM at ``spill_gbs``. ``reorder_gbs`` prices the
    layout copies onnxruntime puts around a kernel (NCHWc reorders around a conv), which are not
    part of its roofline (and slow down ``reorder_spill`` times past the cache); ``output_us`` is the
    extra cost of each output after the first (a Split allocates and hands over every part);
    ``unblocked_gflops`` is the extra time per FLOP
    of a conv onnxruntime cannot run blocked (input channels not a multiple of the NCHWc block,
    e.g. a network's first conv), several times slower than the blocked kernels.
    """

    peak_gflops: float = 50.0
    bandwidth_gbs: float = 10.0
    overhead_us: float = 2.0
    spill_gbs: float = math.inf
    cache_bytes: float = math.inf
    reorder_gbs: float = math.inf
    output_us: float = 0.0
    unblocked_gflops: float = math.inf
    reorder_spill: float = 1.0
    additive: bool = False
    """Compute and memory time add (a kernel that copies its operands into place, then computes:
    onnxsat's products pack their image operand, its convs transpose or pad theirs) instead of
    overlapping (the max of the two)."""

    def time_us(
        self,
        flops: float,
        bytes_moved: float,
        reorder_bytes: float = 0.0,
        kernels: int = 1,
        outputs: int = 1,
        unblocked_flops: float = 0.0,
    ) -> float:
        """One kernel's time; ``kernels`` counts its dispatches (layout copies included)."""
        compute = flops / (self.peak_gflops * 1e3)
        rate = self.bandwidth_gbs if bytes_moved <= self.cache_bytes else self.spill_gbs
        memory = bytes_moved / (rate * 1e3)
        return (
            self.overhead_us * kernels
            + self.output_us * (outputs - 1)
            + (compute + memory if self.additive else max(compute, memory))
            + reorder_bytes
            * (self.reorder_spill if reorder_bytes > self.cache_bytes else 1.0)
            / (self.reorder_gbs * 1e3)
            + unblocked_flops / (self.unblocked_gflops * 1e3)
        )


FUSED_NODE_US = 0.01
"""A node onnxruntime fuses into its producer's kernel runs no kernel of its own (calibration's
dispatch cost, ~1-2 us, would make a fused chain look as dear as separate kernels); not zero, so
that of two programs otherwise equal the one with fewer nodes wins."""

NCHWC_BLOCK = 16
"""Channel block of onnxruntime's NCHWc layout on AVX-512 (8 on AVX2): a conv whose input has a
multiple of it as channels runs blocked and needs a ReorderInput unless its producer runs blocked."""

NCHWC_CONSUMERS = frozenset(
    {"conv", "max_pool", "average_pool", "global_average_pool", "concat", "add", "mul", "batch_norm"}
    | _ACTIVATIONS
)
"""Ops onnxruntime's NCHWc transformer runs on a blocked tensor (or fuses into the conv that makes
it); any other consumer of a conv's output reads it through a ReorderOutput copy."""


def nchwc_reorders(
    op: str,
    in_shapes: list[tuple[int, ...] | None],
    out_shape: tuple[int, ...] | None,
    reorder_input: bool,
    reorder_output: bool = False,
    itemsize: int = 4,
) -> tuple[int, float]:
    """(count, bytes) of the layout copies onnxruntime's NCHWc transformer puts around a 2-D conv.

    ``reorder_input``: the input is a plain NCHW tensor and is copied to blocked (when its
    channels are a multiple of the block); ``reorder_output``: the result goes to a consumer that
    cannot read the blocked layout (or is a graph output). Calibration's single-node samples pay
    both. In a model, a conv's ReorderOutput is charged to the consumer that needs it
    (``nchwc_output_reorders``: a conv feeding a conv, pool or fused activation pays none), and
    its ReorderInput only when its input may be a Split output (each part is its own tensor): the
    ReorderInput of a shared tensor is done once for all the convs that read it, so charging it
    per conv would make k sibling convs look k - 1 reorders dearer than their merge.
    """
    if op != "conv" or not in_shapes or in_shapes[0] is None or len(in_shapes[0]) != 4 or out_shape is None:
        return 0, 0.0
    count, moved = 0, 0.0
    if reorder_output:
        count, moved = 1, float(numel(out_shape) * itemsize)
    channels = in_shapes[0][1]
    if reorder_input and channels > 0 and channels % NCHWC_BLOCK == 0:
        count, moved = count + 1, moved + numel(in_shapes[0]) * itemsize
    return count, moved


def nchwc_output_reorders(ctx: NodeCtx) -> tuple[int, float]:
    """(count, bytes) of the ReorderOutput copies a node that cannot read the blocked layout needs
    for its inputs that a conv may produce (4-D tensors from a class holding a conv)."""
    if ctx.node.op in NCHWC_CONSUMERS or ctx.node.op in VIEW_OPS:
        return 0, 0.0
    count, moved = 0, 0.0
    for i, (ops, shape) in enumerate(zip(ctx.in_ops, ctx.in_shapes, strict=False)):
        if "conv" in ops and shape is not None and len(shape) == 4:
            count += 1
            moved += numel(shape) * _ITEMSIZE.get(ctx.in_dtypes[i] or 1, 4)
    return count, moved


def nchwc_unblocked(op: str, in_shapes: list[tuple[int, ...] | None]) -> bool:
    """A 2-D conv whose input channels are not a multiple of the NCHWc block: ORT runs it on
    the plain NCHW input with a slower kernel (and needs no ReorderInput)."""
    if op != "conv" or not in_shapes or in_shapes[0] is None or len(in_shapes[0]) != 4:
        return False
    return in_shapes[0][1] % NCHWC_BLOCK != 0


def col2im_us(op: str, in_shapes: list[tuple[int, ...] | None], consts: ClassConstants) -> float:
    """onnxruntime runs a ConvTranspose as a GEMM into a ``C_out*prod(k)`` x ``prod(input spatial)``
    column buffer, then a col2im that adds each column element into the output (``im[...] +=
    col[...]``): per column element the GEMM writes it, col2im reads it and reads and writes an
    output element, four float accesses after the GEMM's roofline, at the class bandwidth. 0 for
    other ops."""
    if op != "conv_transpose" or len(in_shapes) < 2 or in_shapes[0] is None or in_shapes[1] is None:
        return 0.0
    x, w = in_shapes[0], in_shapes[1]
    column = numel(w[1:]) * numel(x[:1]) * numel(x[2:])
    return 4.0 * column * 4 / (consts.bandwidth_gbs * 1e3)


def node_work(
    op: str,
    in_shapes: list[tuple[int, ...] | None],
    in_dtypes: list[int | None],
    out_shape: tuple[int, ...] | None,
    out_dtype: int | None,
    attrs: dict[str, object],
) -> tuple[float, float]:
    """FLOPs (from the op table's formula) and bytes read plus written by one kernel."""
    spec = BY_CTOR.get(op)
    flops = spec.flops(CostCtx(in_shapes, out_shape, attrs)) if spec is not None else 0.0
    bytes_moved = sum(
        numel(s) * _ITEMSIZE.get(d or 1, 4) for s, d in zip(in_shapes, in_dtypes, strict=False)
    ) + numel(out_shape) * _ITEMSIZE.get(out_dtype or 1, 4)
    return float(flops), float(bytes_moved)


@dataclass(frozen=True)
class RooflineCost:
    """Analytic roofline cost of one kernel per node, per op class, optionally ORT-fusion-aware."""

    name: str = "ort-cpu"
    default: ClassConstants = field(default_factory=ClassConstants)
    classes: dict[str, ClassConstants] = field(default_factory=dict)
    """Per op class constants; a class missing here uses ``default``."""
    view_overhead_us: float = 0.2
    """Cost of a metadata-only op: one cheap dispatch."""
    fusion: str = "none"
    """``ort``: price ORT's graph fusions (the ort-cpu target); ``onnxsat``: the lowering's fusion
    of elementwise and layout nodes into their consumers (onnxsat-cpu); ``none``: one kernel per node."""
    run_overhead_us: float = 0.0
    """Fixed cost of one inference call (not part of any node; added to whole-model estimates)."""
    graph_output_us: float = 0.0
    """Cost of handing one graph output back to the caller (per output; whole-model estimates)."""
    calibrated: bool = False
    source: str = "built-in defaults"

    def constants(self, cls: str) -> ClassConstants:
        found = self.classes.get(cls)
        if found is None and cls in PARENT_CLASS:
            found = self.classes.get(PARENT_CLASS[cls])
        return found if found is not None else self.default

    def node_cost(self, ctx: NodeCtx) -> float:
        op = ctx.node.op
        if ctx.is_const or op.startswith("Tensor.") or op.startswith("TList."):
            return 0.0
        if op == REORDER_OP:
            return self._reorder_us(ctx)
        cls = node_class(op, ctx.in_shapes)
        if cls == "view":
            return self.classes["view"].overhead_us if "view" in self.classes else self.view_overhead_us
        if self.fusion == "ort" and ort_fuses_into_producer(ctx):
            return FUSED_NODE_US + self._folded_operand_us(ctx, cls)
        attrs = _named_attrs(ctx.node) if op in BY_CTOR else {}
        flops, bytes_moved = node_work(op, ctx.in_shapes, ctx.in_dtypes, ctx.out_shape, ctx.out_dtype, attrs)
        if self.fusion == "onnxsat" and cls == "conv":
            cls, flops, bytes_moved = onnxsat_conv(ctx.in_shapes, ctx.out_shape, attrs, flops, bytes_moved)
        if self.fusion == "onnxsat" and cls == "depthwise":
            flops, bytes_moved = onnxsat_depthwise(ctx, attrs, flops, bytes_moved)
        consts = self.constants(cls)
        if self.fusion == "onnxsat" and cls in INLINED_CLASSES:
            return onnxsat_inlined_us(ctx, flops if cls == "elementwise" else 0.0, consts)
        if self.fusion == "onnxsat" and cls == "matmul":
            flops *= panel_waste(ctx.out_shape)
        reorders, reorder_bytes, unblocked, copies = 0, 0.0, 0.0, 0.0
        if self.fusion == "ort":
            split_input = bool(ctx.in_ops) and "split" in ctx.in_ops[0]
            reorders, reorder_bytes = nchwc_reorders(
                op, ctx.in_shapes, ctx.out_shape, reorder_input=split_input
            )
            unblocked = flops if nchwc_unblocked(op, ctx.in_shapes) else 0.0
            count, moved = nchwc_output_reorders(ctx)
            if count:  # a conv's layout copies are priced at the conv class's rates
                copies = self.constants("conv").time_us(0.0, 0.0, moved, kernels=count)
        parts = _outputs_of_one_kernel(op, ctx.in_shapes, attrs)
        if parts > 1:
            # One e-node per output of a multi-output kernel (Split): the kernel reads its input
            # once, writes every output and pays for each extra output; each e-node pays its share.
            out_bytes = numel(ctx.out_shape) * _ITEMSIZE.get(ctx.out_dtype or 1, 4)
            whole = bytes_moved + out_bytes * (parts - 1)
            return (consts.time_us(flops, whole, outputs=parts) + copies) / parts
        return (
            copies
            + consts.time_us(flops, bytes_moved, reorder_bytes, 1 + reorders, unblocked_flops=unblocked)
            + col2im_us(op, ctx.in_shapes, consts)
        )

    def _reorder_us(self, ctx: NodeCtx) -> float:
        """Laying a tensor out channel-blocked for the depthwise conv that reads it. On onnxsat's
        kernels nothing where the producer's store does it (a conv's product, also through its
        activation epilogue; judged from the ops of the input's e-class, as the ``ort`` mode
        judges fusions), else a copy of the tensor. Other targets run the Identity it is written
        as: a copy, which their price of the conv never repays."""
        if self.fusion == "onnxsat" and ctx.in_ops and ctx.in_ops[0] & STORES_BLOCKED:
            return FUSED_NODE_US
        moved = 2.0 * numel(ctx.out_shape) * _ITEMSIZE.get(ctx.out_dtype or 1, 4)
        return self.constants("layout").time_us(0.0, moved)

    def _folded_operand_us(self, ctx: NodeCtx, cls: str) -> float:
        """Reading the constant operands ORT folds into the producer's weights/bias at run time.

        Without it a fused BatchNorm would look cheaper than the bias its fold adds to the conv,
        and extraction would keep the BatchNorm (it prices within a rounding error either way).
        """
        if len(ctx.in_const) != len(ctx.in_shapes):
            return 0.0
        folded = sum(
            numel(shape) * _ITEMSIZE.get(dtype or 1, 4)
            for shape, dtype, const in zip(ctx.in_shapes, ctx.in_dtypes, ctx.in_const, strict=False)
            if const and shape is not None
        )
        consts = self.constants(cls)
        return consts.time_us(0.0, folded) - consts.overhead_us


REORDER_OP = "reorder_nchwc"
"""The e-node of a tensor laid out channel-blocked for a depthwise conv (``conv_layout``)."""
STORES_BLOCKED = frozenset({"conv", "relu", "clip", "hard_swish", "fused_silu", "mul"})
"""Producers whose store lays their result out for a depthwise conv (blocked, or into its padded
planes): a 1x1 conv's product, with its activation epilogue (``lowering.rules_nn``'s
``_blocked_pointwise`` and ``_row_padded_planes``; SiLU as ``x * sigmoid(x)`` is a Mul). Judged by
op alone: a dense conv or another Mul is taken to store so too."""


def _ints(attrs: dict[str, object], name: str, default: tuple[int, ...]) -> tuple[int, ...]:
    """An ints attribute of an e-node (``default`` where it is absent or empty)."""
    value = attrs.get(name)
    return tuple(int(v) for v in value) if isinstance(value, (tuple, list)) and value else default


def reads_blocked(ctx: NodeCtx, attrs: dict[str, object]) -> bool:
    """A conv that reads its input laid out channel-blocked and has a blocked kernel."""
    group = attrs.get("group")
    blocked_input = bool(ctx.in_ops) and REORDER_OP in ctx.in_ops[0]
    w = ctx.in_shapes[1] if len(ctx.in_shapes) > 1 else None
    return blocked_input and can_run_blocked(ctx.in_shapes[0], w, group if isinstance(group, int) else 1)


def onnxsat_depthwise(ctx: NodeCtx, attrs: dict[str, object], flops: float, bytes_moved: float) -> tuple[float, float]:
    """FLOPs and bytes of a depthwise conv on onnxsat's kernels: flat, its lanes' waste, and at
    stride 1 a padded copy of its input unless a product stored it into the conv's padded planes
    (the blocked conv's copy is its reorder e-node's)."""
    blocked = reads_blocked(ctx, attrs)
    waste = onnxsat_depthwise_waste(ctx.in_shapes, ctx.out_shape, attrs, blocked)
    flops, bytes_moved = flops * waste, bytes_moved * waste
    stored_by_producer = bool(ctx.in_ops) and bool(ctx.in_ops[0] & STORES_BLOCKED)
    x = ctx.in_shapes[0]
    if not blocked and not stored_by_producer and all(s == 1 for s in _ints(attrs, "strides", ())) and x is not None:
        bytes_moved += 2.0 * numel(x) * _ITEMSIZE.get(ctx.in_dtypes[0] or 1, 4)
    return flops, bytes_moved


def onnxsat_depthwise_waste(
    in_shapes: list[tuple[int, ...] | None], out_shape: tuple[int, ...] | None, attrs: dict[str, object], blocked: bool
) -> float:
    """How much more than its outputs a depthwise conv computes on onnxsat's kernels: nothing
    blocked (its lanes are channels), ``flat_lane_waste`` flat."""
    w = in_shapes[1] if len(in_shapes) > 1 else None
    if blocked or w is None or out_shape is None or len(out_shape) < 3:
        return 1.0
    ones = (1,) * (len(out_shape) - 2)
    return flat_lane_waste(w[2:], _ints(attrs, "strides", ones), _ints(attrs, "dilations", ones), out_shape[2:])


INLINED_CLASSES = frozenset({"elementwise", "layout", "transpose", "split"})
"""Cost classes of the ops computed inside their consumer's kernel (``kernel_plan`` groups them so,
and the lowering follows; a Split's parts are views, or slices its consumers read)."""
_PART_READERS = frozenset({"gather", "slice_", "split"})
"""Ops that read only the part of their first input they write (an embedding's rows; a Split's
e-node is one part)."""
_STORE_EPILOGUE = frozenset({"conv", "matmul", "gemm"})
"""Producers whose kernel applies a following activation or bias as it stores (their epilogues)."""


GEMM_PANEL_COLUMNS = 48
"""Columns of one packed panel of onnxsat's GEMM micro-kernel (``kernels.gemm.NR``): a product
computes whole panels, so N = 64 costs what N = 96 does."""


def panel_waste(out_shape: tuple[int, ...] | None) -> float:
    """Computed over useful columns of a product on onnxsat's micro-kernel (1.0 when N fills its
    panels)."""
    n = out_shape[-1] if out_shape else 0
    if n <= 0:
        return 1.0
    return math.ceil(n / GEMM_PANEL_COLUMNS) * GEMM_PANEL_COLUMNS / n


def onnxsat_conv(
    in_shapes: list[tuple[int, ...] | None], out_shape: tuple[int, ...] | None, attrs: dict[str, object], flops: float, bytes_moved: float
) -> tuple[str, float, float]:
    """The class, FLOPs and bytes of a dense conv as onnxsat's CPU backend runs it: Winograd
    (``winograd_conv_work``) or any other conv as given."""
    winograd = winograd_conv_work(in_shapes, out_shape, attrs)
    return ("conv", flops, bytes_moved) if winograd is None else ("winograd", *winograd)


def winograd_conv_work(in_shapes: list[tuple[int, ...] | None], out_shape: tuple[int, ...] | None, attrs: dict[str, object]) -> tuple[float, float] | None:
    """FLOPs and bytes of a conv that onnxsat's CPU backend runs as Winograd (``conv_algorithm``:
    its products and transform traffic); None for any other conv."""
    x, w = (list(in_shapes) + [None, None])[:2]
    if x is None or w is None or out_shape is None or len(x) != 4 or len(w) != 4 or len(out_shape) != 4:
        return None
    strides = attrs.get("strides") or (1, 1)
    dilations = attrs.get("dilations") or (1, 1)
    group = attrs.get("group") or 1
    m = winograd_tile(x, w, int(group), w[2:], list(strides), list(dilations), out_shape[2:])  # type: ignore[call-overload]
    return None if m is None else winograd_work(x, w, out_shape[2:], m)


def onnxsat_inlined_us(ctx: NodeCtx, flops: float, consts: ClassConstants) -> float:
    """An elementwise or layout node inside another kernel: its FLOPs (a layout node's copies are
    its consumer's reads: none), and a read of each input that is a stored tensor (a weight, a
    graph input, another kernel's output), except the output of a conv or product it is the
    epilogue of (read while still in registers). Its own output is never written: the consuming
    kernel takes it as computed.

    Judged from every op an input's e-class holds, as the ``ort`` mode does: an input some
    elementwise or layout node can compute is taken as inlined too."""
    read = 0.0
    for i, (shape, dtype) in enumerate(zip(ctx.in_shapes, ctx.in_dtypes, strict=False)):
        ops = ctx.in_ops[i] if i < len(ctx.in_ops) else frozenset()
        if any(op_class(op) in INLINED_CLASSES for op in ops):
            continue  # computed in this kernel too
        part = i == 0 and ctx.node.op in _PART_READERS  # reads as much of it as it writes
        strided = part and not _contiguous_part(shape, ctx.out_shape)
        if i == 0 and ops & _STORE_EPILOGUE and not strided:
            continue  # the producer's epilogue, or a contiguous part of its output (a view)
        # a strided part (a column split of a matrix) is gathered row by row: read and written
        read += numel(ctx.out_shape if part else shape) * _ITEMSIZE.get(dtype or 1, 4) * (2 if strided else 1)
    rate = consts.bandwidth_gbs if read <= consts.cache_bytes else consts.spill_gbs
    return max(flops / (consts.peak_gflops * 1e3), read / (rate * 1e3))


def _contiguous_part(whole: tuple[int, ...] | None, part: tuple[int, ...] | None) -> bool:
    """Whether ``part`` (a slice of ``whole`` along one axis) is one contiguous block of it: every
    dim before the sliced one is 1 (a channel split of one image is; a column split of a matrix
    is strided, so its parts are copied)."""
    if whole is None or part is None or len(whole) != len(part):
        return False
    axis = next((d for d, (w, p) in enumerate(zip(whole, part, strict=True)) if w != p), len(whole))
    return all(d == 1 for d in whole[:axis])


def ort_fuses_into_producer(ctx: NodeCtx) -> bool:
    """True when onnxruntime's CPU graph optimizer folds this node into the kernel producing its input.

    Modelled: ConvActivationFusion and GemmActivationFusion (Relu, LeakyRelu, Clip, Sigmoid,
    Tanh), ConvBNFusion, ConvAddFusion/ConvMulFusion with a constant operand, the NCHWc
    Conv+Add(sum) fusion, MatMulAddFusion (MatMul + constant bias -> Gemm), Transpose pairs
    merged by the transpose optimizer, the Erf-based GeluFusion (Erf after the Div, the Add/Mul
    tail), QuickGeluFusion (x * Sigmoid), and LayerNormFusion of the decomposed pattern (each step
    after the first ReduceMean, recognised by the op its input comes from; see
    ``_in_decomposed_layer_norm``), so a decomposed block onnxruntime runs fused is not priced
    as a dozen kernels against onnxsat's fused ops.
    Not modelled: attention fusions.
    """
    op = ctx.node.op
    # Judged from every op the input's class holds (per-node costs cannot see which node
    # extraction picks there). Pricing a class that may be a merge's Split part as unfusable
    # instead would price the original program above its own cost once saturation adds the merge
    # (its fused activations turn unfused), so extraction could end above where it started.
    ins = ctx.in_ops
    if not ins:
        return False
    const = ctx.in_const if len(ctx.in_const) == len(ins) else (False,) * len(ins)
    if _in_decomposed_layer_norm(op, ins, const):
        return True
    if op == "erf":
        return "div" in ins[0]
    if op == "mul" and len(ins) == 2 and any("sigmoid" in s for s in ins):
        return True
    if op in _ACTIVATIONS:
        return bool(ins[0] & (_CONV_LIKE | _GEMM_LIKE))
    if op == "batch_norm":
        return bool(ins[0] & _CONV_LIKE) and all(const[1:])
    if op == "transpose":
        return "transpose" in ins[0]
    if op in ("add", "mul") and len(ins) == 2:
        for i in (0, 1):
            other = 1 - i
            if ins[i] & _CONV_LIKE and (const[other] or op == "add"):
                return True
            if op == "add" and ins[i] & _MATMUL_LIKE and const[other]:
                return True
        return any("erf" in s for s in ins)
    return False


def _in_decomposed_layer_norm(op: str, ins: tuple[frozenset[str], ...], const: tuple[bool, ...]) -> bool:
    """A step of mean/variance normalization after its first ReduceMean: x - mean, its square,
    the mean of that, + eps, sqrt, the division, and the constant scale and shift after it.
    onnxruntime's LayerNormFusion runs the whole chain as one LayerNormalization kernel."""
    if op == "sub" and len(ins) == 2:
        return "reduce_mean" in ins[1]
    if op == "pow_":
        return "sub" in ins[0] and len(const) > 1 and const[1]
    if op == "reduce_mean":
        return "pow_" in ins[0]
    if op == "sqrt":
        return "add" in ins[0]
    if op == "div" and len(ins) == 2:
        return "sqrt" in ins[1]
    if op in ("add", "mul") and len(ins) == 2:
        before = {"add": "reduce_mean", "mul": "div"}[
            op
        ]  # + eps after the variance, * gamma after the division
        return any(before in ins[i] and const[1 - i] for i in (0, 1)) or (
            op == "add" and any("mul" in ins[i] and "div" not in ins[i] and const[1 - i] for i in (0, 1))
        )
    return False


def _outputs_of_one_kernel(op: str, in_shapes: list[tuple[int, ...] | None], attrs: dict[str, object]) -> int:
    """How many e-nodes (one per output) share the kernel of an indexed-output op like Split."""
    spec = BY_CTOR.get(op)
    if spec is None or not spec.indexed_outputs:
        return 1
    if spec.output_count:
        return spec.output_count
    count = attrs.get("num_outputs")
    if isinstance(count, int) and count > 0:
        return count
    sizes = in_shapes[1] if len(in_shapes) > 1 else None
    return max(1, sizes[0]) if sizes else 1


def _named_attrs(node: ENode) -> dict[str, object]:
    spec = BY_CTOR[node.op]
    literals = [a for a in node.args if not isinstance(a, Ref)]
    return {attr.name: value for attr, value in zip(spec.attrs, literals, strict=False)}


def known_dims(shape: tuple[int, ...] | None) -> tuple[int, ...] | None:
    """Symbolic dims priced as 1 (the cost of one batch/sequence element)."""
    if shape is None:
        return None
    return tuple(d if d >= 0 else 1 for d in shape)


def relative_error(predicted: float, measured: float) -> float:
    """|predicted - measured| / measured (inf when nothing was measured)."""
    return abs(predicted - measured) / measured if measured > 0 else math.inf
