"""onnxsat fused kinds: one e-graph node for a chain that has no standard ONNX op at the model's opset.

The fusion rules create them so extraction prices the chain as one memory pass and the lowering
layer can emit one kernel. On export they become onnxruntime contrib ops when
``--allow-contrib-ops`` asks for them, else the original chain of standard ops (never a custom op
onnxruntime cannot run). RMSNorm is a standard op from opset 23 (RMSNormalization): it is written as
that op where the model is at opset 23 or is converted to it as a whole (``opset_upgrade.py``), and
only where the installed onnxruntime has a kernel for it at that dtype (``ort_probe.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from .. import lang as L
from ..opset_upgrade import UPGRADE_DOMAIN
from .ort_probe import ABSENT, KernelProbe, ort_runs
from .registry import Attr, CostCtx, ExportNode, OpSpec, numel, register

CONTRIB = "com.microsoft"
GELU_TANH_SCALE = math.sqrt(2.0 / math.pi)
GELU_TANH_CUBIC = 0.044715


class _Chain:
    """Builds the nodes of an expansion: fresh inner names and typed scalar constants."""

    def __init__(self, node: ExportNode, dtype: int):
        self.node, self.dtype = node, dtype
        self.nodes: list[Any] = []

    def const(self, value: float) -> str:
        name = self.node.fresh("onnxsat_const")
        array = np.array(value, dtype=helper.tensor_dtype_to_np_dtype(self.dtype))
        self.nodes.append(
            helper.make_node("Constant", [], [name], value=numpy_helper.from_array(array, name))
        )
        return name

    def array(self, value: np.ndarray) -> str:
        """A constant tensor (a cache computed at export from constant inputs)."""
        name = self.node.fresh("onnxsat_const")
        self.nodes.append(helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value, name)))
        return name

    def ints(self, values: list[int]) -> str:
        """An int64 vector constant (axes, shapes)."""
        name = self.node.fresh("onnxsat_const")
        array = np.array(values, dtype=np.int64)
        self.nodes.append(helper.make_node("Constant", [], [name], value=numpy_helper.from_array(array, name)))
        return name

    def op(
        self, op_type: str, inputs: list[str], out: str | None = None, domain: str = "", **attrs: Any
    ) -> str:
        name = out or self.node.fresh(f"onnxsat_{op_type.lower()}")
        self.nodes.append(helper.make_node(op_type, inputs, [name], domain=domain or None, **attrs))
        return name

    def reduce_mean_last(self, x: str) -> str:
        """ReduceMean over the last axis with kept dims, in the form of the model's opset."""
        if self.node.opset >= 18:
            return self.op("ReduceMean", [x, self.ints([-1])], keepdims=1)
        return self.op("ReduceMean", [x], axes=[-1], keepdims=1)


def _gelu_chain(chain: _Chain, x: str, approximate: str, out: str) -> None:
    """0.5 * x * (1 + erf(x / sqrt 2)), or the tanh form, as PyTorch exports them."""
    if chain.node.opset >= 20:
        chain.op("Gelu", [x], out, **({"approximate": approximate} if approximate != "none" else {}))
        return
    if approximate == "tanh":
        # Pow(x, 3) as torch writes it: onnxruntime's FastGeluFusion matches that chain and not
        # x * x * x (GPT-2's GELU: 8 kernels, 11 ms of 200, against FastGelu's 2.8 ms); its CPU Pow
        # has no float16 kernel, so half types keep the products
        if chain.dtype in (TensorProto.FLOAT, TensorProto.DOUBLE):
            cube = chain.op("Pow", [x, chain.const(3.0)])
        else:
            cube = chain.op("Mul", [chain.op("Mul", [x, x]), x])
        inner = chain.op("Add", [x, chain.op("Mul", [cube, chain.const(GELU_TANH_CUBIC)])])
        core = chain.op("Tanh", [chain.op("Mul", [inner, chain.const(GELU_TANH_SCALE)])])
    else:
        core = chain.op("Erf", [chain.op("Div", [x, chain.const(math.sqrt(2.0))])])
    half_x = chain.op("Mul", [x, chain.const(0.5)])
    chain.op("Mul", [half_x, chain.op("Add", [core, chain.const(1.0)])], out)


def _silu_export(node: ExportNode) -> None:
    (x,), (out,) = node.inputs, node.outputs
    if node.allow_contrib:  # QuickGelu(alpha=1) is x * sigmoid(x)
        node.op_type, node.domain, node.attrs = "QuickGelu", CONTRIB, {"alpha": 1.0}
        return
    chain = _Chain(node, 0)
    chain.op("Mul", [x, chain.op("Sigmoid", [x])], out)
    node.expansion = chain.nodes


def _contrib_runs(approximate: str, dtype: int) -> bool:
    """onnxruntime 1.32 has float64 kernels for FastGelu (tanh) but not for com.microsoft Gelu and
    BiasGelu (erf): a float64 erf GELU is written as its chain even with contrib ops allowed."""
    return approximate == "tanh" or dtype != TensorProto.DOUBLE


def _gelu_export(node: ExportNode) -> None:
    approximate, dtype = str(node.attrs.pop("approximate", "none")), int(node.attrs.pop("dtype"))
    if node.allow_contrib and _contrib_runs(approximate, dtype):
        node.op_type, node.domain = ("FastGelu" if approximate == "tanh" else "Gelu"), CONTRIB
        return
    chain = _Chain(node, dtype)
    _gelu_chain(chain, node.inputs[0], approximate, node.outputs[0])
    node.expansion = chain.nodes


def _bias_gelu_export(node: ExportNode) -> None:
    """With contrib ops: FastGelu with its bias input (tanh), Add + com.microsoft Gelu (erf); else
    the Add and the chain. Not BiasGelu: onnxruntime 1.32's CPU BiasGelu took twice Gelu's time
    (BERT-base, 12 layers: 4.8 against 2.4 ms, profiled, one thread), and the Add before a Gelu is
    free there, since onnxruntime fuses the MatMul + Add before it into one Gemm."""
    approximate, dtype = str(node.attrs.pop("approximate", "none")), int(node.attrs.pop("dtype"))
    if node.allow_contrib and approximate == "tanh" and _contrib_runs(approximate, dtype):
        node.op_type, node.domain = "FastGelu", CONTRIB
        return
    chain = _Chain(node, dtype)
    total = chain.op("Add", node.inputs)
    if node.allow_contrib and _contrib_runs(approximate, dtype):
        chain.op("Gelu", [total], node.outputs[0], domain=CONTRIB)
    else:
        _gelu_chain(chain, total, approximate, node.outputs[0])
    node.expansion = chain.nodes


# ---------------------------------------------------------------- opset-23 standard ops
def _standard_domain(node: ExportNode, probe: KernelProbe, dtype: int) -> str | None:
    """The domain to write an op new at ``probe.opset`` in: the default one when the model is at that
    opset, the placeholder domain when the whole model may be converted to it; None when neither,
    or when onnxruntime has no kernel for the op at ``dtype``."""
    if node.opset >= probe.opset:
        domain = ""
    elif node.upgrade_opset is not None and node.upgrade_opset >= probe.opset:
        domain = UPGRADE_DOMAIN
    else:
        return None
    return domain if ort_runs(probe, dtype) else None


RMS_NORM_PROBE = KernelProbe("RMSNormalization", "", 23, (((2, 3, 8), None), ((8,), None)), (("epsilon", 1e-5),))
SKIP_RMS_NORM_PROBE = KernelProbe(
    "SkipSimplifiedLayerNormalization",
    CONTRIB,
    17,
    (((2, 3, 8), None), ((2, 3, 8), None), ((8,), None)),
    (("epsilon", 1e-5),),
)


def _rms_norm_nodes(chain: _Chain, x: str, scale: str, epsilon: float, out: str) -> None:
    """RMSNormalization (opset 23, or the placeholder of an opset upgrade) where onnxruntime runs it,
    else x * (1 / sqrt(mean(x * x) + epsilon)) * scale as the chain of the model's opset."""
    domain = _standard_domain(chain.node, RMS_NORM_PROBE, chain.dtype)
    if domain is not None:
        chain.op("RMSNormalization", [x, scale], out, domain=domain, epsilon=epsilon)
        return
    mean = chain.reduce_mean_last(chain.op("Mul", [x, x]))
    inv = chain.op("Reciprocal", [chain.op("Sqrt", [chain.op("Add", [mean, chain.const(epsilon)])])])
    chain.op("Mul", [chain.op("Mul", [x, inv]), scale], out)


def _rms_norm_export(node: ExportNode) -> None:
    epsilon, dtype = float(node.attrs.pop("epsilon")), int(node.attrs.pop("dtype"))
    chain = _Chain(node, dtype)
    _rms_norm_nodes(chain, node.inputs[0], node.inputs[1], epsilon, node.outputs[0])
    node.expansion = chain.nodes


def _skip_rms_norm_export(node: ExportNode) -> None:
    """Add + RMSNormalization where the model has (or gets) opset 23, else with contrib ops
    SkipSimplifiedLayerNormalization (output 3 is the sum), else Add + the chain.

    onnxruntime 1.32's CPU SkipSimplifiedLayerNormalization took about twice the time of Add +
    RMSNormalization at hidden 256 to 4096 (one thread, [1, 128, D]), and 0.86-0.96x that of Add +
    the chain: so it is written only where RMSNormalization cannot be."""
    epsilon, dtype = float(node.attrs.pop("epsilon")), int(node.attrs.pop("dtype"))
    (x, skip, scale), (normed, total) = node.inputs, node.outputs
    standard = _standard_domain(node, RMS_NORM_PROBE, dtype) is not None
    if node.allow_contrib and not standard and ort_runs(SKIP_RMS_NORM_PROBE, dtype):
        node.op_type, node.domain, node.attrs = "SkipSimplifiedLayerNormalization", CONTRIB, {"epsilon": epsilon}
        node.outputs = [normed, "", "", total]
        return
    chain = _Chain(node, dtype)
    _rms_norm_nodes(chain, chain.op("Add", [x, skip], total), scale, epsilon, normed)
    node.expansion = chain.nodes


ATTENTION_PROBE = KernelProbe(
    "Attention", "", 23, (((1, 2, 3, 4), None), ((1, 2, 5, 4), None), ((1, 2, 5, 4), None), ((1, 1, 3, 5), None)), (("scale", 0.5),)
)
"""Attention with an additive mask of q's type; without a mask the same op with three inputs."""
ROTARY_PROBE = KernelProbe("RotaryEmbedding", "", 23, (((1, 2, 3, 4), None), ((1, 3, 2), None), ((1, 3, 2), None)))
CONTRIB_ROTARY_PROBE = KernelProbe(
    "RotaryEmbedding", CONTRIB, 17, (((1, 2, 3, 4), None), ((1,), TensorProto.INT64), ((4, 2), None), ((4, 2), None))
)
"""com.microsoft RotaryEmbedding of a [batch, heads, seq, head] x, a position offset (the probe feeds
1: the caches have room for it), [seq, head/2] caches."""


def _attention_chain(chain: _Chain, q: str, k: str, v: str, mask: str, scale: float, out: str) -> None:
    """softmax(q @ k^T * scale + mask) @ v as the chain of the model's opset (a float mask, or none;
    with a mask, a row whose every score is -inf is zero, as Attention makes it)."""
    scores = chain.op("MatMul", [q, chain.op("Transpose", [k], perm=[0, 1, 3, 2])])
    if scale != 1.0:
        scores = chain.op("Mul", [scores, chain.const(scale)])
    if not mask:
        chain.op("MatMul", [chain.op("Softmax", [scores], axis=-1), v], out)
        return
    probs = chain.op("Softmax", [chain.op("Add", [scores, mask])], axis=-1)
    zeroed = chain.op("Where", [chain.op("IsNaN", [probs]), chain.const(0.0), probs])  # a fully masked row is 0
    chain.op("MatMul", [zeroed, v], out)


def _attention_export(node: ExportNode) -> None:
    """Attention (opset 23, or the placeholder of an opset upgrade) where onnxruntime runs it at
    this dtype (with this mask); else, with contrib ops, MultiHeadAttention where onnxruntime runs
    it; else the chain. Attention's scale multiplies q @ k^T (onnxruntime scales q and k by its
    square root each, as the exporters' chains do).

    MultiHeadAttention only where Attention cannot be written: on onnxruntime 1.32's CPU provider it
    was never faster than Attention with the head split and merge around it (x0.92-0.99 at BERT-base,
    GPT-2 and 8-head layers of sequence 128, a tie at Whisper's 1500; two threads, two runs;
    benchmarks/results/contrib_attention.md)."""
    scale, dtype = float(node.attrs.pop("scale")), int(node.attrs.pop("dtype"))
    q, k, v, *rest = node.inputs
    mask = rest[0] if rest else ""
    probe = ATTENTION_PROBE if mask else _without_mask(ATTENTION_PROBE)
    long = _long_scores(node)  # the chain (see LONG_SCORES; MultiHeadAttention given 4-D k, v is no flash attention)
    domain = None if long else _standard_domain(node, probe, dtype)
    chain = _Chain(node, dtype)
    heads = _mha_heads(node, dtype, bool(mask)) if domain is None and node.allow_contrib and not long else None
    if domain is not None:
        chain.op("Attention", [q, k, v, *([mask] if mask else [])], node.outputs[0], domain=domain, scale=scale)
    elif heads is not None:
        _mha_nodes(chain, q, k, v, mask, scale, heads, node.outputs[0])
    else:
        _attention_chain(chain, q, k, v, mask, scale, node.outputs[0])
    node.expansion = chain.nodes


ATTENTION_3D_PROBE = KernelProbe(
    "Attention",
    "",
    23,
    (((1, 3, 8), None), ((1, 5, 8), None), ((1, 5, 8), None), ((1, 1, 3, 5), None)),
    (("scale", 0.5), ("q_num_heads", 2), ("kv_num_heads", 2)),
)
"""Attention over [batch, seq, heads * head] q, k, v (the heads split and merged inside the op)."""
MHA_3D_PROBE = KernelProbe(
    "MultiHeadAttention",
    CONTRIB,
    17,
    (((1, 3, 8), None), ((1, 5, 8), None), ((1, 5, 8), None), ABSENT, ABSENT, ((1, 1, 3, 5), None)),
    (("num_heads", 2), ("scale", 0.5)),
)


def _attention_3d_export(node: ExportNode) -> None:
    """Attention with q_num_heads = kv_num_heads = heads (opset 23, or the upgrade placeholder) where
    onnxruntime runs it; else, with contrib ops, MultiHeadAttention on the same 3-D inputs (its NaN
    rows zeroed, as in ``_mha_nodes``); else each of q, k, v split into heads, the 4-D chain, and
    the heads merged (what the exporters wrote). Long blocks (``LONG_SCORES``) are written as the
    chain, or unmasked with contrib ops as MultiHeadAttention (flash attention: it needs 3-D k, v).

    On onnxruntime 1.32's CPU provider the 3-D op ran an attention block x1.10-1.12 faster than the
    4-D op with the exporters' Reshape and Transpose around it (BERT-base and GPT-2 layers, sequence
    128, one thread; benchmarks/results/contrib_attention.md)."""
    scale, heads, dtype = float(node.attrs.pop("scale")), int(node.attrs.pop("heads")), int(node.attrs.pop("dtype"))
    q, k, v, *rest = node.inputs
    mask = rest[0] if rest else ""
    out = node.outputs[0]
    chain = _Chain(node, dtype)
    long = _long_scores(node)
    standard = ATTENTION_3D_PROBE if mask else _without_mask(ATTENTION_3D_PROBE)
    domain = None if long else _standard_domain(node, standard, dtype)
    mha = MHA_3D_PROBE if mask else _without_mask(MHA_3D_PROBE)
    bias_fits = not mask or len(node.in_shape(3) or ()) == 4  # the attention bias is [B or 1, H or 1, T, S]
    flash = not mask and dtype == TensorProto.FLOAT  # onnxruntime runs it as flash attention
    if domain is not None:
        attrs = {"scale": scale, "q_num_heads": heads, "kv_num_heads": heads}
        chain.op("Attention", [q, k, v, *([mask] if mask else [])], out, domain=domain, **attrs)
    elif node.allow_contrib and bias_fits and (flash or not long) and ort_runs(mha, dtype):
        inputs = [q, k, v, *(["", "", mask] if mask else [])]
        if mask:
            merged = chain.op("MultiHeadAttention", inputs, domain=CONTRIB, num_heads=heads, scale=scale)
            chain.op("Where", [chain.op("IsNaN", [merged]), chain.const(0.0), merged], out)
        else:
            chain.op("MultiHeadAttention", inputs, out, domain=CONTRIB, num_heads=heads, scale=scale)
    else:
        split = chain.ints([0, 0, heads, -1])
        q4, k4, v4 = (chain.op("Transpose", [chain.op("Reshape", [x, split])], perm=[0, 2, 1, 3]) for x in (q, k, v))
        heads_out = node.fresh("onnxsat_attention")
        _attention_chain(chain, q4, k4, v4, mask, scale, heads_out)
        chain.op("Reshape", [chain.op("Transpose", [heads_out], perm=[0, 2, 1, 3]), chain.ints([0, 0, -1])], out)
    node.expansion = chain.nodes


LONG_SCORES = 1 << 20
"""Scores per head (query length x key length) from which an attention block is long: there
onnxruntime 1.32's Attention kernel (one [T, S] score matrix per head, computed whole) gained
nothing over the exporters' chain of MatMul, Softmax and MatMul, and lost with two threads
(Whisper-tiny's encoder, 1500 x 1500: x1.003 against x1.009 on one thread, x0.986 against x1.001
on two, original / optimized), while its contrib MultiHeadAttention without a mask runs flash
attention, 14% faster than Attention there (benchmarks/results/contrib_attention.md)."""


def _long_scores(node: ExportNode) -> bool:
    """Whether the fused node's query and key lengths (the next-to-last dim of q and k, 3-D or 4-D)
    are known and their product is long."""
    q, k = node.in_shape(0), node.in_shape(1)
    if q is None or k is None or len(q) < 3 or len(k) < 3 or q[-2] < 0 or k[-2] < 0:
        return False
    return q[-2] * k[-2] >= LONG_SCORES


MHA_PROBE = KernelProbe(
    "MultiHeadAttention",
    CONTRIB,
    17,
    (((1, 3, 8), None), ((1, 2, 5, 4), None), ((1, 2, 5, 4), None), ABSENT, ABSENT, ((1, 1, 3, 5), None)),
    (("num_heads", 2), ("scale", 0.5)),
)
"""MultiHeadAttention with a 3-D query, keys and values of [batch, heads, seq, head] (what the
fused node holds) and an additive bias of q's type (empty bias and key padding mask before it)."""


def _mha_heads(node: ExportNode, dtype: int, masked: bool) -> int | None:
    """q's head count where MultiHeadAttention can take the fused node: q, k, v 4-D with known,
    equal head counts and one head size (grouped-query k and v are repeated before the fused node),
    and onnxruntime runs the op at ``dtype`` (with the bias, where there is a mask)."""
    shapes = [node.in_shape(i) for i in range(3)]
    if any(s is None or len(s) != 4 for s in shapes):
        return None
    (_, heads, _, size), (_, k_heads, _, k_size), (_, v_heads, _, v_size) = shapes  # type: ignore[misc]
    if heads <= 0 or size <= 0 or k_heads != heads or v_heads != heads or k_size != size or v_size != size:
        return None
    mask = node.in_shape(3) if masked else None
    if mask is not None and len(mask) != 4:  # the attention bias is [B or 1, H or 1, T, S]
        return None
    probe = MHA_PROBE if masked else KernelProbe(MHA_PROBE.op_type, CONTRIB, 17, MHA_PROBE.inputs[:3], MHA_PROBE.attrs)
    return heads if ort_runs(probe, dtype) else None


def _mha_nodes(chain: _Chain, q: str, k: str, v: str, mask: str, scale: float, heads: int, out: str) -> None:
    """q [B, H, T, D] -> [B, T, H * D], MultiHeadAttention with k and v as [B, H, S, D] and the mask
    as its attention bias, the output back to [B, H, T, D] (dims copied: batch and sequence stay
    symbolic). A fully masked row (every mask entry -inf) is NaN in MultiHeadAttention and zero in
    the fused node: the output's NaNs are zeroed where there is a mask."""
    query = chain.op("Reshape", [chain.op("Transpose", [q], perm=[0, 2, 1, 3]), chain.ints([0, 0, -1])])
    inputs = [query, k, v, *(["", "", mask] if mask else [])]
    merged = chain.op("MultiHeadAttention", inputs, domain=CONTRIB, num_heads=heads, scale=scale)
    if mask:
        merged = chain.op("Where", [chain.op("IsNaN", [merged]), chain.const(0.0), merged])
    split = chain.op("Reshape", [merged, chain.ints([0, 0, heads, -1])])
    chain.op("Transpose", [split], out, perm=[0, 2, 1, 3])


def _without_mask(probe: KernelProbe) -> KernelProbe:
    return KernelProbe(probe.op_type, probe.domain, probe.opset, probe.inputs[:3], probe.attrs)


def _halves_equal(value: np.ndarray | None) -> bool:
    """A [1, 1, seq, head] constant whose last-axis halves are equal (cos(concat(f, f)) of the
    exporters: RotaryEmbedding's cache holds one half)."""
    if value is None or value.ndim != 4 or value.shape[:2] != (1, 1) or value.shape[-1] % 2:
        return False
    half = value.shape[-1] // 2
    return bool(np.array_equal(value[..., :half], value[..., half:]))


def _rotary_export(node: ExportNode) -> None:
    """RotaryEmbedding (opset 23 or the upgrade placeholder) where cos and sin are constants with
    equal halves and onnxruntime runs it, its caches being their first halves as [1, seq, head/2]
    (the fusion rule takes x of batch 1: RotaryEmbedding without position ids wants a cache of x's
    batch); else, with contrib ops, com.microsoft RotaryEmbedding (caches [seq, head/2], position
    offset 0) where onnxruntime runs it; else the chain x * cos + concat(-x2, x1) * sin.

    The contrib op only where the standard one cannot be written: the two tied on onnxruntime 1.32's
    CPU provider at [1, 8, 128, 64] and [1, 32, 128, 128] (benchmarks/results/contrib_attention.md)."""
    dtype = int(node.attrs.pop("dtype"))
    (x, cos, sin), (out,) = node.inputs, node.outputs
    chain = _Chain(node, dtype)
    values = [node.folded_value(1), node.folded_value(2)]
    domain = _standard_domain(node, ROTARY_PROBE, dtype)
    contrib = domain is None and node.allow_contrib and ort_runs(CONTRIB_ROTARY_PROBE, dtype)
    if (domain is not None or contrib) and all(_halves_equal(v) for v in values):
        caches = []
        for value in values:
            assert value is not None
            half = value.shape[-1] // 2
            cache = np.ascontiguousarray(value[0, :, :, :half])
            caches.append(chain.array(cache if domain is not None else cache[0]))
        if domain is not None:
            chain.op("RotaryEmbedding", [x, *caches], out, domain=domain)
        else:  # positions 0 .. seq - 1 for every batch entry: a position offset of 0
            chain.op("RotaryEmbedding", [x, chain.ints([0]), *caches], out, domain=CONTRIB)
        node.expansion = chain.nodes
        return
    first, second = node.fresh("onnxsat_half"), node.fresh("onnxsat_half")
    halves: dict[str, Any] = {"axis": -1, **({"num_outputs": 2} if node.opset >= 18 else {})}  # an even split
    chain.nodes.append(helper.make_node("Split", [x], [first, second], **halves))
    rotated = chain.op("Concat", [chain.op("Neg", [second]), first], axis=-1)
    chain.op("Add", [chain.op("Mul", [x, cos]), chain.op("Mul", [rotated, sin])], out)
    node.expansion = chain.nodes


def _flops(per_element: float) -> Callable[[CostCtx], float]:
    return lambda ctx: per_element * numel(ctx.out_shape)


def _attention_work(batch_heads: float, t: float, s: float, d: float, dv: float) -> float:
    """2 * T * S * (D + Dv) per batch and head for the two products, plus the softmax."""
    return float(max(batch_heads, 1) * max(t, 1) * max(s, 1) * (2 * (max(d, 1) + max(dv, 1)) + 5))


def _attention_flops(ctx: CostCtx) -> float:
    q, k = (ctx.in_shapes + [None, None])[:2]
    if q is None or k is None or len(q) != 4 or len(k) != 4 or ctx.out_shape is None:
        return 0.0
    return _attention_work(q[0] * q[1], q[2], k[2], q[3], ctx.out_shape[3])


def _attention_3d_flops(ctx: CostCtx) -> float:
    """The same attention with its heads split."""
    q, k = (ctx.in_shapes + [None, None])[:2]
    heads = max(int(ctx.attrs.get("heads", 1)), 1)
    if q is None or k is None or len(q) != 3 or len(k) != 3 or ctx.out_shape is None:
        return 0.0
    return _attention_work(max(q[0], 1) * heads, q[1], k[1], max(q[2], 1) / heads, max(ctx.out_shape[2], 1) / heads)


_GELU_ATTRS = (Attr("approximate", "string", "none"), Attr("dtype", "int"))

register(
    OpSpec("onnxsat.FusedSiLU", L.fused_silu, ("X",), export=_silu_export, flops=_flops(4.0)),
    OpSpec("onnxsat.FusedGelu", L.fused_gelu, ("X",), _GELU_ATTRS, export=_gelu_export, flops=_flops(8.0)),
    OpSpec(
        "onnxsat.FusedBiasGelu",
        L.fused_bias_gelu,
        ("X", "bias"),
        _GELU_ATTRS,
        family="binary",
        export=_bias_gelu_export,
        flops=_flops(9.0),
    ),
    OpSpec(
        "onnxsat.FusedRMSNorm",
        L.fused_rms_norm,
        ("X", "scale"),
        (Attr("epsilon", "float"), Attr("dtype", "int")),
        family="norm",
        export=_rms_norm_export,
        flops=_flops(4.0),
    ),
    OpSpec(
        "onnxsat.FusedAttention",
        L.fused_attention,
        ("Q", "K", "V", "attn_mask?"),
        (Attr("scale", "float"), Attr("dtype", "int")),
        family="matmul",
        export=_attention_export,
        flops=_attention_flops,
    ),
    OpSpec(
        "onnxsat.FusedAttention3D",
        L.fused_attention_3d,
        ("Q", "K", "V", "attn_mask?"),
        (Attr("scale", "float"), Attr("heads", "int"), Attr("dtype", "int")),
        family="matmul",
        export=_attention_3d_export,
        flops=_attention_3d_flops,
    ),
    OpSpec(
        "onnxsat.FusedRotary",
        L.fused_rotary,
        ("X", "cos", "sin"),
        (Attr("dtype", "int"),),
        family="binary",
        export=_rotary_export,
        flops=_flops(3.0),
    ),
    OpSpec(
        "onnxsat.FusedSkipRMSNorm",
        L.fused_skip_rms_norm,
        ("X", "skip", "scale"),
        (Attr("epsilon", "float"), Attr("dtype", "int")),
        family="norm",
        export=_skip_rms_norm_export,
        flops=_flops(2.5),  # per output: the sum, then 4 per element for the norm
        indexed_outputs=True,
        output_count=2,
    ),
)
