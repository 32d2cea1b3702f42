"""Neural-network ops: MatMul, Gemm, Conv, ConvTranspose, normalizations, pooling."""

from __future__ import annotations

import math

from .. import lang as L
from .registry import Attr, CostCtx, ExportNode, ImportNode, OpSpec, Unsupported, numel, register


def _matmul_flops(ctx: CostCtx) -> float:
    a = ctx.in_shapes[0]
    k = a[-1] if a else 1
    return 2.0 * numel(ctx.out_shape) * max(k, 1)


def _gemm_flops(ctx: CostCtx) -> float:
    a = ctx.in_shapes[0]
    k = (a[0] if ctx.attrs.get("transA") else a[1]) if a and len(a) == 2 else 1
    return 2.0 * numel(ctx.out_shape) * max(k, 1) + numel(ctx.out_shape)


def _conv_flops(ctx: CostCtx) -> float:
    w = ctx.in_shapes[1]
    per_output = numel(w[1:]) if w else 1
    return 2.0 * numel(ctx.out_shape) * per_output


def _conv_transpose_flops(ctx: CostCtx) -> float:
    x, w = ctx.in_shapes[0], ctx.in_shapes[1]
    return 2.0 * numel(x) * (numel(w[1:]) if w else 1)


def _pool_flops(ctx: CostCtx) -> float:
    return float(numel(ctx.out_shape) * max(1, math.prod(ctx.attrs.get("kernel") or [1])))


def _norm_flops(ctx: CostCtx) -> float:
    return 5.0 * numel(ctx.out_shape)


def _spatial_rank(node: ImportNode) -> int:
    kernel = node.attrs.get("kernel_shape")
    if kernel:
        return len(kernel)
    for i in (1, 0):
        rank = node.input_rank(i) if i < len(node.inputs) else None
        if rank is not None:
            return rank - 2
    raise Unsupported("spatial rank unknown")


def _resolve_auto_pad(node: ImportNode, kernel: list[int], transpose: bool = False) -> list[int]:
    """Explicit begin/end pads for ``auto_pad`` (needs known spatial input dims for SAME_*)."""
    auto_pad = node.attrs.pop("auto_pad", "NOTSET")
    if isinstance(auto_pad, bytes):
        auto_pad = auto_pad.decode()
    n = len(kernel)
    if auto_pad in ("NOTSET", ""):
        return list(node.attrs.pop("pads", [0] * (2 * n)))
    node.attrs.pop("pads", None)
    if auto_pad == "VALID":
        return [0] * (2 * n)
    if transpose:
        raise Unsupported("ConvTranspose with auto_pad SAME")
    shape = node.input_shapes[0]
    if shape is None or any(d < 0 for d in shape[2:]):
        raise Unsupported("auto_pad SAME with unknown spatial dims")
    strides = node.attrs.get("strides") or [1] * n
    dilations = node.attrs.get("dilations") or [1] * n
    begin, end = [], []
    for d, k, s, dil in zip(shape[2:], kernel, strides, dilations, strict=True):
        out = -(-d // s)
        total = max(0, (out - 1) * s + (k - 1) * dil + 1 - d)
        small, big = total // 2, total - total // 2
        begin.append(small if auto_pad == "SAME_UPPER" else big)
        end.append(big if auto_pad == "SAME_UPPER" else small)
    return begin + end


def _conv_normalize(node: ImportNode) -> None:
    n = _spatial_rank(node)
    w_shape = node.input_shapes[1] if len(node.input_shapes) > 1 else None
    kernel = node.attrs.pop("kernel_shape", None) or (list(w_shape[2:]) if w_shape else None)
    if kernel is None:
        raise Unsupported("Conv kernel shape unknown")
    node.attrs["pads"] = _resolve_auto_pad(node, list(kernel), transpose=node.op_type == "ConvTranspose")
    node.attrs.setdefault("strides", [1] * n)
    node.attrs.setdefault("dilations", [1] * n)
    if node.op_type == "ConvTranspose":
        if node.attrs.pop("output_shape", None) is not None:
            raise Unsupported("ConvTranspose with output_shape")
        node.attrs.setdefault("output_padding", [0] * n)


def _pool_normalize(node: ImportNode) -> None:
    kernel = node.attrs.pop("kernel_shape", None)
    if kernel is None:
        raise Unsupported("pool without kernel_shape")
    n = len(kernel)
    node.attrs["kernel"] = list(kernel)
    node.attrs["pads"] = _resolve_auto_pad(node, list(kernel))
    node.attrs.setdefault("strides", [1] * n)
    if node.op_type == "MaxPool":
        node.attrs.pop("storage_order", None)  # only affects the Indices output
        node.attrs.setdefault("dilations", [1] * n)
    elif any(d != 1 for d in node.attrs.pop("dilations", [1] * n)):
        raise Unsupported("AveragePool with dilations")


def _pool_export(node: ExportNode) -> None:
    node.attrs["kernel_shape"] = node.attrs.pop("kernel")
    if node.opset < 10:
        if node.attrs.get("ceil_mode"):
            raise Unsupported("ceil_mode needs opset 10")
        node.attrs.pop("ceil_mode", None)
        if any(d != 1 for d in node.attrs.pop("dilations", [])):
            raise Unsupported("MaxPool dilations need opset 10")


def _batch_norm_normalize(node: ImportNode) -> None:
    if node.attrs.pop("training_mode", 0):
        raise Unsupported("BatchNormalization in training mode")
    if not node.attrs.pop("spatial", 1):
        raise Unsupported("BatchNormalization with spatial=0")
    for legacy in ("momentum", "is_test", "consumed_inputs"):
        node.attrs.pop(legacy, None)


def _layer_norm_normalize(node: ImportNode) -> None:
    node.attrs.pop("stash_type", None)  # float32 statistics: what the modelled op computes


def _gemm_normalize(node: ImportNode) -> None:
    node.attrs.pop("broadcast", None)


def _gemm_export(node: ExportNode) -> None:
    if node.opset < 11 and (len(node.inputs) < 3 or not node.inputs[2]):
        raise Unsupported("Gemm without C needs opset 11")
    if node.opset < 7:
        node.attrs["broadcast"] = 1  # C broadcasts only when asked before opset 7


register(
    OpSpec("MatMul", L.matmul, ("A", "B"), family="matmul", flops=_matmul_flops),
    OpSpec(
        "Gemm",
        L.gemm,
        ("A", "B", "C?"),
        (Attr("alpha", "float", 1.0), Attr("beta", "float", 1.0), Attr("transA", "int", 0), Attr("transB", "int", 0)),
        family="gemm",
        normalize=_gemm_normalize,
        export=_gemm_export,
        flops=_gemm_flops,
    ),
    OpSpec(
        "Conv",
        L.conv,
        ("X", "W", "B?"),
        (Attr("strides", "ints"), Attr("pads", "ints"), Attr("dilations", "ints"), Attr("group", "int", 1)),
        family="conv",
        normalize=_conv_normalize,
        flops=_conv_flops,
    ),
    OpSpec(
        "ConvTranspose",
        L.conv_transpose,
        ("X", "W", "B?"),
        (
            Attr("strides", "ints"),
            Attr("pads", "ints"),
            Attr("dilations", "ints"),
            Attr("group", "int", 1),
            Attr("output_padding", "ints"),
        ),
        family="conv",
        normalize=_conv_normalize,
        flops=_conv_transpose_flops,
    ),
    OpSpec(
        "BatchNormalization",
        L.batch_norm,
        ("X", "scale", "B", "mean", "var"),
        (Attr("epsilon", "float", 1e-5),),
        family="norm",
        normalize=_batch_norm_normalize,
        flops=_norm_flops,
        min_opset=7,
    ),
    OpSpec(
        "LayerNormalization",
        L.layer_norm,
        ("X", "Scale", "B?"),
        (Attr("axis", "int", -1), Attr("epsilon", "float", 1e-5)),
        family="norm",
        normalize=_layer_norm_normalize,
        flops=_norm_flops,
        min_opset=17,
    ),
    OpSpec(
        "LRN",
        L.lrn,
        ("X",),
        (Attr("alpha", "float", 1e-4), Attr("beta", "float", 0.75), Attr("bias", "float", 1.0), Attr("size", "int")),
        family="norm",
        flops=lambda ctx: float(numel(ctx.out_shape) * (ctx.attrs.get("size") or 1) + 4 * numel(ctx.out_shape)),
    ),
    OpSpec(
        "MaxPool",
        L.max_pool,
        ("X",),
        (
            Attr("kernel", "ints"),
            Attr("strides", "ints"),
            Attr("pads", "ints"),
            Attr("dilations", "ints"),
            Attr("ceil_mode", "int", 0),
        ),
        family="pool",
        normalize=_pool_normalize,
        export=_pool_export,
        flops=_pool_flops,
    ),
    OpSpec(
        "AveragePool",
        L.average_pool,
        ("X",),
        (
            Attr("kernel", "ints"),
            Attr("strides", "ints"),
            Attr("pads", "ints"),
            Attr("ceil_mode", "int", 0),
            Attr("count_include_pad", "int", 0),
        ),
        family="pool",
        normalize=_pool_normalize,
        export=_pool_export,
        flops=_pool_flops,
    ),
    OpSpec("GlobalAveragePool", L.global_average_pool, ("X",), family="pool", flops=lambda ctx: float(numel(ctx.in_shapes[0]))),
)
