"""The tensor language: egglog sorts, one constructor per modelled ONNX op, and analyses.

Conventions every row of the op table relies on:

* A constructor's arguments are the op's tensor inputs first (in ONNX order; an absent
  optional input is ``Tensor.none()``; variadic inputs are one ``TList``), then its
  attributes as typed literals (``i64``, ``f64``, ``String``, ``Vec[i64]``), normalized to the
  newest opset's meaning.
* Attributes that moved from attributes to inputs over opset versions (axes, split, pads,
  clip bounds, slice starts) are always inputs here.
* Multi-output ops are one constructor per output, carrying the output index, so every
  ``Tensor`` is one value (export regroups them into one node).
* Dims are ``i64``: ``>= 0`` is a known dim, ``< 0`` a symbolic one (its name is in the
  program's symbol table). Rules that need a dim's value guard on ``d >= 0``.
"""

from __future__ import annotations

from egglog import Expr, StringLike, Vec, f64Like, function, i64, i64Like, relation

__all__ = [
    "Tensor",
    "TList",
    "shape",
    "dtype",
    "tensor_ref",
    "is_const",
]


class Tensor(Expr):
    """One tensor-valued ONNX expression."""

    @classmethod
    def input(cls, name: StringLike) -> Tensor:
        """A true graph input (never folded)."""

    @classmethod
    def weight(cls, name: StringLike) -> Tensor:
        """An initializer or Constant; its values live in the program's weight table."""

    @classmethod
    def splat(cls, value: f64Like, dims: Vec[i64], dtype: i64Like) -> Tensor:
        """A uniform constant (ConstantOfShape, or a small all-equal initializer)."""

    @classmethod
    def ints(cls, values: Vec[i64], rank: i64Like) -> Tensor:
        """A small int64 constant of rank 0 (one value) or rank 1, whose values rules can read."""

    @classmethod
    def none(cls) -> Tensor:
        """An absent optional input."""


class TList(Expr):
    """A list of tensors, for variadic inputs (Concat, opaque nodes)."""

    @classmethod
    def nil(cls) -> TList: ...

    @classmethod
    def cons(cls, head: Tensor, tail: TList) -> TList: ...


# ---------------------------------------------------------------- analyses
@function
def shape(t: Tensor) -> Vec[i64]:
    """Shape analysis. No merge: two shapes for one e-class is an unsound rule."""


@function
def dtype(t: Tensor) -> i64:
    """Element type (onnx.TensorProto enum). No merge, like shape."""


@function
def tensor_ref(index: i64Like) -> Tensor:
    """Original tensor ``index`` of the imported graph (a marker, never an extraction choice).

    Terms refer to their inputs through these, so every imported term is shallow; the
    smallest index in an e-class names the tensor on export.
    """


is_const = relation("is_const", Tensor)
"""Holds when a tensor depends on weights only (folded at export, free at extraction)."""

list_const = relation("list_const", TList)

SMALL_MAGNITUDE = 4096.0
"""Bound of ``small_const`` (2**12): a float32 sum with such a term rounds x by at most 2**-12."""

small_const = relation("small_const", Tensor)
"""Holds for a constant whose every value has magnitude <= ``SMALL_MAGNITUDE``: a float Add of it
may be reassociated ((x + 1e8) - 1e8 rounds x to a multiple of 8, x + (1e8 - 1e8) does not)."""

varies = relation("varies", Tensor)
"""Holds when a tensor depends on a graph input (so constant-canonicalizing rules skip weight-only
arithmetic, which folds at export anyway)."""

list_varies = relation("list_varies", TList)


@function
def graph_output(index: i64Like) -> Tensor:
    """Marks the e-class of graph output ``index`` (a root; never an extraction choice)."""


@function
def model_opset() -> i64:
    """The model's default-domain opset (set at import): a rule that creates an op guards on it, so
    it never writes an op the model's opset does not have."""


# ---------------------------------------------------------------- opaque and multi-output
@function
def opaque(key: i64Like, inputs: TList, index: i64Like) -> Tensor:
    """Output ``index`` of an unmodelled node kept verbatim in the program's node table."""


# ---------------------------------------------------------------- elementwise unary
@function
def relu(x: Tensor) -> Tensor: ...
@function
def sigmoid(x: Tensor) -> Tensor: ...
@function
def tanh(x: Tensor) -> Tensor: ...
@function
def erf(x: Tensor) -> Tensor: ...
@function
def neg(x: Tensor) -> Tensor: ...
@function
def exp(x: Tensor) -> Tensor: ...
@function
def log(x: Tensor) -> Tensor: ...
@function
def sqrt(x: Tensor) -> Tensor: ...
@function
def reciprocal(x: Tensor) -> Tensor: ...
@function
def abs_(x: Tensor) -> Tensor: ...
@function
def identity(x: Tensor) -> Tensor: ...
@function
def isnan(x: Tensor) -> Tensor:
    """ONNX IsNaN (a bool tensor of x's shape): the exporters' guard of a fully masked softmax row."""


@function
def leaky_relu(x: Tensor, alpha: f64Like) -> Tensor: ...
@function
def gelu(x: Tensor, approximate: StringLike) -> Tensor: ...
@function
def cast(x: Tensor, to: i64Like) -> Tensor: ...
@function
def clip(x: Tensor, lo: Tensor, hi: Tensor) -> Tensor: ...
@function
def softmax(x: Tensor, axis: i64Like) -> Tensor:
    """Softmax over one axis (the opset-13 meaning; older forms are normalized or opaque)."""


@function
def hard_sigmoid(x: Tensor, alpha: f64Like, beta: f64Like) -> Tensor: ...
@function
def hard_swish(x: Tensor) -> Tensor: ...
@function
def swish(x: Tensor, alpha: f64Like) -> Tensor: ...


# ---------------------------------------------------------------- onnxsat fused kinds (no standard ONNX op at the model's opset)
@function
def fused_silu(x: Tensor) -> Tensor:
    """x * sigmoid(x) as one pass (ONNX has Swish only from opset 24)."""


@function
def fused_gelu(x: Tensor, approximate: StringLike, dtype: i64Like) -> Tensor:
    """GELU as one pass below opset 20; ``dtype`` types the constants of its exported chain."""


@function
def fused_bias_gelu(x: Tensor, bias: Tensor, approximate: StringLike, dtype: i64Like) -> Tensor:
    """gelu(x + bias) as one pass (onnxruntime's BiasGelu/FastGelu with contrib ops)."""


@function
def fused_rms_norm(x: Tensor, scale: Tensor, epsilon: f64Like, dtype: i64Like) -> Tensor:
    """x / sqrt(mean(x * x over the last axis) + epsilon) * scale as one pass: opset 23's
    RMSNormalization; ``dtype`` is x's type (the export probes onnxruntime's kernel for it)."""


@function
def fused_skip_rms_norm(x: Tensor, skip: Tensor, scale: Tensor, epsilon: f64Like, dtype: i64Like, index: i64Like) -> Tensor:
    """Output ``index`` of a residual Add and the RMSNorm of its sum in one pass (onnxruntime's
    SkipSimplifiedLayerNormalization): 0 is ``fused_rms_norm(x + skip, scale)``, 1 is ``x + skip``."""


@function
def reorder_nchwc(x: Tensor) -> Tensor:
    """``x`` laid out channel-blocked (NCHWc) for the depthwise conv that reads it: the value of x,
    a layout choice for extraction to price (a copy, or free where x's producer stores it so)."""


@function
def fused_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: f64Like, dtype: i64Like) -> Tensor:
    """softmax(q @ k^T * scale + mask over the last axis) @ v for 4-D [batch, heads, seq, head]
    q, k, v and a float mask (or none) that broadcasts to the scores without growing them: opset
    23's Attention; ``dtype`` is q's type (the export probes onnxruntime's kernel for it)."""


@function
def fused_attention_3d(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: f64Like, heads: i64Like, dtype: i64Like
) -> Tensor:
    """``fused_attention`` with the heads packed in the last dim: q [batch, seq, heads * head], k and
    v [batch, kv_seq, heads * head] split into ``heads`` heads, the output [batch, seq, heads * v
    head] merged back (opset 23's Attention with q_num_heads = kv_num_heads = heads): the exporters'
    Reshape and Transpose around each of q, k, v and the output are inside the op."""


@function
def fused_rotary(x: Tensor, cos: Tensor, sin: Tensor, dtype: i64Like) -> Tensor:
    """x * cos + rotate_half(x) * sin for a 4-D [batch, heads, seq, head] x (rotate_half(x) is
    concat(-x2, x1) of x's two halves on the last axis) and cos, sin of shape [1, 1, seq, head]:
    opset 23's RotaryEmbedding where cos and sin are constants whose two halves are equal."""


# ---------------------------------------------------------------- elementwise binary (broadcasting)
@function
def add(a: Tensor, b: Tensor) -> Tensor: ...
@function
def sub(a: Tensor, b: Tensor) -> Tensor: ...
@function
def mul(a: Tensor, b: Tensor) -> Tensor: ...
@function
def div(a: Tensor, b: Tensor) -> Tensor: ...
@function
def pow_(a: Tensor, b: Tensor) -> Tensor: ...
@function
def where(cond: Tensor, a: Tensor, b: Tensor) -> Tensor: ...


# ---------------------------------------------------------------- linear algebra and NN
@function
def matmul(a: Tensor, b: Tensor) -> Tensor: ...
@function
def gemm(a: Tensor, b: Tensor, c: Tensor, alpha: f64Like, beta: f64Like, trans_a: i64Like, trans_b: i64Like) -> Tensor: ...
@function
def conv(
    x: Tensor, w: Tensor, b: Tensor, strides: Vec[i64], pads: Vec[i64], dilations: Vec[i64], group: i64Like
) -> Tensor:
    """Conv with explicit pads (auto_pad is resolved at import) and kernel shape taken from w."""


@function
def conv_transpose(
    x: Tensor,
    w: Tensor,
    b: Tensor,
    strides: Vec[i64],
    pads: Vec[i64],
    dilations: Vec[i64],
    group: i64Like,
    output_padding: Vec[i64],
) -> Tensor: ...
@function
def batch_norm(x: Tensor, scale: Tensor, bias: Tensor, mean: Tensor, var: Tensor, epsilon: f64Like) -> Tensor:
    """Inference-mode BatchNormalization (one output)."""


@function
def layer_norm(x: Tensor, scale: Tensor, bias: Tensor, axis: i64Like, epsilon: f64Like) -> Tensor: ...
@function
def lrn(x: Tensor, alpha: f64Like, beta: f64Like, bias: f64Like, size: i64Like) -> Tensor: ...
@function
def max_pool(
    x: Tensor, kernel: Vec[i64], strides: Vec[i64], pads: Vec[i64], dilations: Vec[i64], ceil_mode: i64Like
) -> Tensor: ...
@function
def average_pool(
    x: Tensor, kernel: Vec[i64], strides: Vec[i64], pads: Vec[i64], ceil_mode: i64Like, count_include_pad: i64Like
) -> Tensor: ...
@function
def global_average_pool(x: Tensor) -> Tensor: ...


# ---------------------------------------------------------------- layout
@function
def transpose(x: Tensor, perm: Vec[i64]) -> Tensor: ...
@function
def reshape(x: Tensor, target: Tensor, allowzero: i64Like) -> Tensor: ...
@function
def flatten(x: Tensor, axis: i64Like) -> Tensor: ...
@function
def squeeze(x: Tensor, axes: Tensor) -> Tensor: ...
@function
def unsqueeze(x: Tensor, axes: Tensor) -> Tensor: ...
@function
def concat(xs: TList, axis: i64Like) -> Tensor: ...
@function
def split(x: Tensor, sizes: Tensor, axis: i64Like, num_outputs: i64Like, index: i64Like) -> Tensor:
    """Output ``index`` of Split (``sizes`` may be none when ``num_outputs`` splits evenly)."""


@function
def slice_(x: Tensor, starts: Tensor, ends: Tensor, axes: Tensor, steps: Tensor) -> Tensor: ...
@function
def gather(x: Tensor, indices: Tensor, axis: i64Like) -> Tensor: ...
@function
def expand(x: Tensor, target: Tensor) -> Tensor: ...
@function
def pad(x: Tensor, pads: Tensor, value: Tensor, axes: Tensor, mode: StringLike) -> Tensor: ...


# ---------------------------------------------------------------- reductions
@function
def reduce_mean(x: Tensor, axes: Tensor, keepdims: i64Like, noop_with_empty_axes: i64Like) -> Tensor: ...
@function
def reduce_sum(x: Tensor, axes: Tensor, keepdims: i64Like, noop_with_empty_axes: i64Like) -> Tensor: ...
@function
def reduce_max(x: Tensor, axes: Tensor, keepdims: i64Like, noop_with_empty_axes: i64Like) -> Tensor: ...


# ---------------------------------------------------------------- shape and constants
@function
def shape_of(x: Tensor, start: i64Like, end: i64Like) -> Tensor:
    """ONNX Shape (``end`` is ``i64`` max for "to the end")."""


@function
def constant_of_shape(target: Tensor, value: f64Like, dtype: i64Like) -> Tensor: ...


def tlist(items: list[Tensor]) -> TList:
    """A TList from a Python list."""
    out = TList.nil()
    for item in reversed(items):
        out = TList.cons(item, out)
    return out


def ivec(values: list[int] | tuple[int, ...]) -> Vec[i64]:
    """A literal ``Vec[i64]`` (egglog needs the element type for an empty one)."""
    if not values:
        return Vec[i64].empty()
    return Vec(*(i64(int(v)) for v in values))
