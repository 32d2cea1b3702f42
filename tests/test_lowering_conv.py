"""The Conv and ConvTranspose lowerings on the cases the node tests lack, against onnxruntime.

Conv: the direct kernels (flat stride-1 form over the padded plane, row form for strides, flat over
the phase planes for strided grouped convs; depthwise, grouped, dilated, 1-D and 3-D, with and without bias; channel-blocked depthwise with a
SiLU), the implicit GEMM of
convs (strides, dilations, pads, an activation applied as the product stores), the position-major
product of small output images and the im2col +
GEMM path for many output channels. ConvTranspose: GEMM + col2im with strides larger than the kernel (residues
no tap reaches), output_padding, groups, dilations, asymmetric pads, output_shape and widths the
stride does not divide. All cases share one model, so they compile once.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from onnxsat.kernels.compile_options import CompileOptions
from onnxsat.kernels.compiled import CompiledModel
from onnxsat.lowering.conv_kernels import DIRECT_MAX_CHANNELS
from onnxsat.lowering.kernel_ir import Binary, Const, Loop, Unary, subexpressions, walk_exprs
from onnxsat.lowering.lower import lower
from onnxsat.lowering.program import KernelStep, MatMulStep
from tests.helpers_onnx import make_model, vi

INPUTS = {"x2": [2, 6, 11, 13], "x1": [1, 4, 17], "x3": [1, 4, 5, 6, 7], "x0": [2, 40, 1, 1], "x4": [2, 16, 13, 9], "x5": [1, 5, 12, 11], "x6": [1, 16, 6, 31], "x7": [2, 8, 7, 6], "x8": [1, 16, 14, 14], "x9": [1, 24, 9, 8]}
"""Inputs; every case reads ``relu(x)`` so a producer has to fuse into the padding or the conv."""

CONVS: dict[str, tuple[str, list[int], dict[str, Any], bool]] = {
    # name: (input, weight shape, attributes, bias)
    "depthwise_s1": ("x2", [6, 1, 3, 3], {"group": 6, "pads": [1, 1, 1, 1]}, True),
    "depthwise_s2": ("x2", [6, 1, 3, 3], {"group": 6, "pads": [1, 0, 1, 1], "strides": [2, 2]}, False),
    # channel-blocked (16 channels a vector; 24 channels: 8): asymmetric pads, a stride on one axis, dilation
    "blocked_s2": ("x4", [16, 1, 3, 3], {"group": 16, "pads": [1, 0, 2, 1], "strides": [2, 2]}, True),
    "blocked_5x3_dil": ("x4", [16, 1, 5, 3], {"group": 16, "pads": [2, 1, 2, 1], "strides": [1, 2], "dilations": [1, 2]}, False),
    "blocked_narrow": ("x4", [16, 1, 3, 3], {"group": 16, "pads": [1, 0, 1, 0]}, True),  # stride 1, 7 wide
    "blocked_silu": ("x6", [16, 1, 3, 3], {"group": 16, "pads": [1, 1, 1, 1], "strides": [2, 2]}, True),  # 16 wide
    "blocked_8": ("x9", [24, 1, 3, 3], {"group": 24, "pads": [1, 1, 1, 1], "strides": [2, 2]}, True),
    "flat_silu": ("x8", [16, 1, 5, 5], {"group": 16, "pads": [2, 2, 2, 2]}, True),  # stride 1, 14 wide: flat
    "grouped_dilated": ("x2", [6, 3, 3, 2], {"group": 2, "dilations": [2, 1], "pads": [2, 0, 1, 1]}, True),
    # strided grouped convs run flat over the phase planes of their input: batch 2, strides on
    # both axes, asymmetric pads, a dilation the stride does not divide
    "grouped_s2": ("x4", [16, 4, 3, 3], {"group": 4, "strides": [2, 2], "pads": [1, 1, 1, 1]}, True),
    "grouped_s23_dil": ("x7", [8, 2, 3, 3], {"group": 4, "strides": [2, 3], "pads": [0, 1, 2, 0], "dilations": [1, 2]}, False),
    "dense_s2_dilated": ("x2", [5, 6, 3, 3], {"strides": [2, 1], "dilations": [1, 2], "pads": [1, 1, 1, 1]}, True),
    "valid_no_pad": ("x2", [3, 6, 2, 4], {}, True),
    "same_upper": ("x2", [4, 6, 4, 3], {"auto_pad": "SAME_UPPER", "strides": [2, 3]}, False),
    "many_channels": ("x2", [DIRECT_MAX_CHANNELS + 4, 6, 3, 3], {"pads": [1, 1, 1, 1]}, True),
    "pointwise": ("x2", [7, 6, 1, 1], {}, True),
    "conv1d": ("x1", [3, 4, 5], {"pads": [2, 1]}, True),
    "conv1d_s3": ("x1", [4, 2, 3], {"strides": [3], "group": 2}, True),
    "conv3d": ("x3", [2, 4, 2, 3, 3], {"pads": [1, 1, 1, 0, 1, 1]}, True),
    "conv3d_s2": ("x3", [2, 4, 3, 3, 2], {"strides": [1, 2, 2], "pads": [1, 1, 0, 1, 1, 1]}, False),
    # implicit GEMM (more channels than a direct kernel takes; batch 1 and 2): shifted windows of the
    # padded input, its phase planes for strides; an extra column per row, a surplus input row
    "implicit_s1": ("x5", [20, 5, 3, 3], {"pads": [1, 1, 1, 1]}, True),
    "implicit_s2": ("x5", [18, 5, 3, 3], {"strides": [2, 2], "pads": [1, 0, 2, 1]}, False),
    "implicit_7x7s2": ("x5", [17, 5, 7, 7], {"strides": [2, 2], "pads": [3, 3, 3, 3]}, True),
    "implicit_dil": ("x5", [20, 5, 3, 2], {"dilations": [2, 3], "strides": [1, 2], "pads": [2, 1, 1, 2]}, True),
    "implicit_s3": ("x5", [20, 5, 2, 2], {"strides": [3, 1]}, True),
    "implicit_same": ("x5", [24, 5, 4, 3], {"auto_pad": "SAME_UPPER", "strides": [2, 1]}, False),
    "implicit_16": ("x5", [16, 5, 3, 3], {"strides": [2, 2], "pads": [1, 1, 1, 1]}, True),  # a direct kernel's size
    "implicit_batch2": ("x4", [20, 16, 3, 3], {"strides": [2, 1], "pads": [1, 1, 1, 1]}, True),
    # position-major (a small output image, 48+ output channels): batch 2, a stride, no bias
    "pm_s1": ("x7", [48, 8, 3, 3], {"pads": [1, 1, 1, 1]}, True),
    "pm_s2": ("x7", [50, 8, 3, 2], {"strides": [2, 2], "pads": [1, 0, 1, 1]}, False),
    "pm_hswish": ("x7", [64, 8, 3, 3], {"pads": [0, 1, 2, 1], "dilations": [1, 2]}, True),
    "pm_1x1": ("x7", [56, 8, 1, 1], {}, True),
    "squeeze": ("x0", [10, 40, 1, 1], {}, True),  # a squeeze-excitation layer: dot products
    "excite": ("x0", [24, 40, 1, 1], {}, False),
}

TRANSPOSES: dict[str, tuple[str, list[int], dict[str, Any], bool]] = {
    "k4_s2_p1": ("x2", [6, 4, 4, 4], {"strides": [2, 2], "pads": [1, 1, 1, 1]}, True),
    "stride_gt_kernel": ("x2", [6, 2, 2, 2], {"strides": [3, 3], "output_padding": [2, 1]}, True),
    "grouped_dilated": ("x2", [6, 2, 3, 3], {"group": 3, "strides": [2, 2], "dilations": [2, 1], "pads": [0, 2, 1, 1]}, False),
    "output_shape": ("x2", [6, 3, 3, 3], {"strides": [2, 2], "output_shape": [22, 27]}, True),
    "same_lower": ("x2", [6, 2, 3, 3], {"strides": [2, 3], "auto_pad": "SAME_LOWER"}, True),
    "conv1d": ("x1", [4, 3, 5], {"strides": [3], "pads": [1, 2]}, True),
    "conv3d": ("x3", [4, 2, 3, 2, 3], {"strides": [2, 1, 2], "pads": [1, 0, 1, 1, 0, 0]}, True),
}

ACTIVATED = {"implicit_s1": "Relu", "implicit_7x7s2": "HardSwish", "implicit_s2": "Relu", "implicit_batch2": "Relu", "blocked_silu": "SiLU", "flat_silu": "SiLU", "pm_s1": "Relu", "pm_hswish": "HardSwish", "pm_1x1": "SiLU"}
"""Convs whose output only an activation reads (the others are graph outputs themselves)."""


def _model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Relu", [name], [f"r{name}"]) for name in INPUTS]
    inits, outs = [], []
    for op, cases in (("Conv", CONVS), ("ConvTranspose", TRANSPOSES)):
        for case, (src, wshape, attrs, bias) in cases.items():
            name = f"{'c' if op == 'Conv' else 't'}_{case}"  # short: buffer names keep 24 characters
            inits.append(numpy_helper.from_array(rng.standard_normal(wshape).astype(np.float32), f"{name}_w"))
            inputs = [f"r{src}", f"{name}_w"]
            if bias:
                channels = wshape[0] if op == "Conv" else wshape[1] * int(attrs.get("group", 1))
                inits.append(numpy_helper.from_array(rng.standard_normal(channels).astype(np.float32), f"{name}_b"))
                inputs.append(f"{name}_b")
            activation = ACTIVATED.get(case) if op == "Conv" else None
            nodes.append(helper.make_node(op, inputs, [f"{name}_pre" if activation else name], **attrs))
            if activation == "SiLU":  # x * sigmoid(x), as TorchScript exports it
                nodes.append(helper.make_node("Sigmoid", [f"{name}_pre"], [f"{name}_sig"]))
                nodes.append(helper.make_node("Mul", [f"{name}_pre", f"{name}_sig"], [name]))
            elif activation:  # read by its activation alone: the product applies it as it stores
                nodes.append(helper.make_node(activation, [f"{name}_pre"], [name]))
            outs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    xs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in INPUTS.items()]
    return helper.make_model(helper.make_graph(nodes, "convs", xs, outs, inits), opset_imports=[helper.make_opsetid("", 19)])


def test_convolutions_match_onnxruntime() -> None:
    model = _model()
    rng = np.random.default_rng(1)
    feeds = {n: rng.standard_normal(s).astype(np.float32) for n, s in INPUTS.items()}
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds), strict=True))
    compiled = CompiledModel(model, CompileOptions(threads=2, cache=False))
    got = compiled(feeds)
    assert not compiled.stats(feeds).fallbacks
    for name, expected in want.items():
        assert got[name].shape == expected.shape, name
        np.testing.assert_allclose(got[name], expected, rtol=1e-4, atol=1e-4, err_msg=name)


def test_few_output_channels_run_without_a_gemm() -> None:
    """Direct kernels for depthwise and few-channel convs, dot products for a 1x1 image; a GEMM for
    many channels and ConvTranspose."""
    model = _model()
    shapes = {n: tuple(s) for n, s in INPUTS.items()}
    steps = lower(model, shapes).steps
    gemms = {s.out.name for s in steps if isinstance(s, MatMulStep)}
    kernels = {s.kernel.name for s in steps if isinstance(s, KernelStep)}
    assert any("c_many_channels" in g for g in gemms)
    assert any("t_k4_s2_p1_col" in g for g in gemms)
    assert any("col2im" in k and "t_k4_s2_p1" in k for k in kernels)
    for case in ("depthwise_s1", "depthwise_s2", "conv3d", "conv1d"):
        assert not any(f"c_{case}" in g for g in gemms), case
        assert any(k.startswith(("fconv_", "dconv_")) and f"c_{case}" in k for k in kernels), case
    for case in ("grouped_s2", "grouped_s23_dil"):
        assert any(k.startswith("fconv_") and k.endswith(f"c_{case}_phased") for k in kernels), case
    for case in ("blocked_s2", "blocked_5x3_dil", "blocked_narrow", "blocked_silu", "blocked_8"):
        assert any(k.startswith("bdconv_") and f"c_{case}" in k for k in kernels), case
        assert any(k.startswith("nchwc_") for k in kernels)
    for case in ("squeeze", "excite"):
        assert not any(f"c_{case}" in g for g in gemms), case
        assert any(k.startswith("matvec_") and f"c_{case}" in k for k in kernels), case


def test_convs_read_shifted_windows_of_the_padded_input() -> None:
    """Convs with overlapping taps run as implicit GEMMs (no im2col kernel): B's rows are
    shifted windows of the padded input or of its phase planes, and ``ShiftedRows.matrix`` (the
    numpy form of those rows) is what im2col would have stored."""
    model = _model()
    steps = lower(model, {n: tuple(s) for n, s in INPUTS.items()}, gemm_epilogues=True).steps
    shifted = {s.out.name: s.b_rows for s in steps if isinstance(s, MatMulStep) and s.b_rows is not None}
    kernels = {s.kernel.name for s in steps if isinstance(s, KernelStep)}
    for case in (c for c in CONVS if c.startswith("implicit_")):
        assert any(f"c_{case}" in name for name in shifted), case
        assert not any("im2col" in k and f"c_{case}" in k for k in kernels), case
    assert not any(f"c_{case}" in name for name in shifted for case in ("pointwise", "depthwise_s1"))  # one tap; groups
    # 11 output columns of 13 padded ones: the product skips the padding (C is the NCHW output);
    # a 6-wide output row is computed on its padded (phase) width
    ((s1, grid),) = [(rows, name) for name, rows in shifted.items() if "c_implicit_s1" in name]
    assert (s1.width, s1.pitch) == (11, 13) and next(s.out.shape for s in steps if isinstance(s, MatMulStep) and s.out.name == grid) == (1, 20, 12 * 11)
    s2 = next(rows for name, rows in shifted.items() if "c_implicit_s2" in name)
    assert s2.width == s2.pitch

    # stride 1, 3x3, dilation 1 over a 2-channel 4x5 input padded by one (6 x 7, plus a zero row)
    x = np.arange(2 * 4 * 5, dtype=np.float32).reshape(2, 4, 5)
    padded = np.zeros((2, 7, 7), np.float32)
    padded[:, 1:5, 1:6] = x
    from onnxsat.lowering.program import ShiftedRows

    taps = tuple(kh * 7 + kw for kh in range(3) for kw in range(3))
    im2col = np.stack([padded[:, kh : kh + 4, kw : kw + 5] for kh in range(3) for kw in range(3)], axis=1).reshape(2, 3, 3, 4, 5)
    # columns on the padded width (the extra two per row unread), or only the output's 5 per row
    b = ShiftedRows(7 * 7, taps, 7, 7).matrix(padded.reshape(-1), 2 * 9, 4 * 7).reshape(2, 3, 3, 4, 7)[..., :5]
    np.testing.assert_array_equal(b, im2col)
    b = ShiftedRows(7 * 7, taps, 5, 7).matrix(padded.reshape(-1), 2 * 9, 4 * 5).reshape(2, 3, 3, 4, 5)
    np.testing.assert_array_equal(b, im2col)


def test_a_flat_depthwise_conv_runs_whole_vectors_and_a_silu_pass() -> None:
    """A stride-1 depthwise conv too wide for the blocked form runs over the flat padded plane in
    whole 16-float vectors (the padded input has a spare row for the last vector's taps: no scalar
    remainder loop); on a 14 x 14 plane (one block per channel) its SiLU is a second loop over the
    stored block."""
    steps = lower(_model(), {n: tuple(s) for n, s in INPUTS.items()}, gemm_epilogues=True).steps
    (conv,) = [s.kernel for s in steps if isinstance(s, KernelStep) and s.kernel.name.startswith("fconv_") and "c_flat_silu" in s.kernel.name]
    loops = [s for s in conv.body if isinstance(s, Loop)]
    assert len(loops) == 2
    for loop in loops:  # positions [start, min(start + block, span)): span a whole number of vectors
        assert isinstance(loop.stop, Binary) and isinstance(loop.stop.b, Const) and loop.stop.b.value % 16 == 0

    def sigmoids(stmt: Loop) -> int:
        return sum(isinstance(e, Unary) and e.op == "sigmoid" for root in walk_exprs((stmt,)) for e in subexpressions(root))

    assert [sigmoids(loop) for loop in loops] == [0, 1]


def test_small_images_run_position_major() -> None:
    """A conv with at most 64 output positions and 48+ channels (a 1x1 conv too) is one product of its
    windows (a row per position, channels last) and the weight laid out [taps x C, M]: a packed-B
    product whose lanes run over output channels, with the bias (and ReLU) in its epilogue."""
    steps = lower(_model(), {n: tuple(s) for n, s in INPUTS.items()}, gemm_epilogues=True).steps
    cases = (("pm_s1", 7 * 6, 48, 9, True), ("pm_s2", 4 * 3, 50, 6, False), ("pm_hswish", 7 * 4, 64, 9, True), ("pm_1x1", 7 * 6, 56, 1, True))
    for case, positions, channels, taps, bias in cases:
        (step,) = [s for s in steps if isinstance(s, MatMulStep) and f"c_{case}" in s.out.name]
        assert step.out.name.endswith("_pm") and step.b_rows is None, case
        assert step.out.shape == (2 * positions, channels) and step.b.shape == (8 * taps, channels), case
        assert (step.bias is not None) == bias and not step.bias_rows and step.relu == (case == "pm_s1"), case


def test_blocked_depthwise_conv_computes_a_block_of_channels_per_vector() -> None:
    """The blocked kernel's channel loop is 16 (or 8) iterations: LLVM vectorizes so short a loop
    only when it needs no run-time overlap check, which the buffers' alias scopes make unnecessary.
    Its NCHW store is scalar stores, not a microcoded AVX-512 scatter (``jit.host_target``)."""
    model = _model()
    compiled = CompiledModel(model, CompileOptions(threads=1, cache=False))
    feeds = {n: np.zeros(s, np.float32) for n, s in INPUTS.items()}
    exe = compiled.executable_for(feeds)
    symbols = [sym for name, sym in exe.symbols.items() if name.startswith("bdconv_")]
    assert len(symbols) == 5
    ir_text = exe.module.optimized_ir()
    for sym in symbols:
        body = ir_text.split(f"@{sym}(", 1)[1].split("\n}\n", 1)[0]
        assert "x float>" in body, f"{sym} did not vectorize"
        assert "llvm.masked.scatter" not in body and "llvm.masked.gather" not in body, sym


def test_a_blocked_depthwise_silu_runs_along_the_stored_rows() -> None:
    """A blocked depthwise conv of 14 or more output columns stores the taps' sums first and applies
    a SiLU in a second loop along each stored row (unit stride, full vectors); on 8-channel vectors
    as they are stored, its ~20 dependent operations made the kernel 1.2x slower. A Relu, and a
    SiLU on narrower rows, stay in the store."""
    steps = lower(_model(), {n: tuple(s) for n, s in INPUTS.items()}, gemm_epilogues=True).steps
    kernels = {s.kernel.name: s.kernel for s in steps if isinstance(s, KernelStep) and s.kernel.name.startswith("bdconv_")}
    silu = next(k for name, k in kernels.items() if "c_blocked_silu" in name)
    assert [type(s) for s in silu.body] == [Loop, Loop]
    taps, rows = silu.body

    def sigmoids(stmt: Loop) -> int:
        return sum(isinstance(e, Unary) and e.op == "sigmoid" for root in walk_exprs((stmt,)) for e in subexpressions(root))

    assert (sigmoids(taps), sigmoids(rows)) == (0, 1)
    assert all(len(k.body) == 1 for name, k in kernels.items() if "c_blocked_silu" not in name)


def test_a_pointwise_conv_reads_a_flat_convs_output_where_it_lies() -> None:
    """A 1x1 conv of a flat depthwise conv's output (a view of its padded plane: rows 18 apart, 14
    wide), gated by a squeeze-excitation or not, reads its B rows from that plane, skipping the
    padding, with the gate applied as they are packed: no contiguous copy of the image first."""
    rng = np.random.default_rng(0)

    def weight(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)

    inits = [weight("wd", 16, 1, 5, 5), weight("bd", 16), weight("ws", 4, 16, 1, 1), weight("we", 16, 4, 1, 1), weight("wp", 24, 16, 1, 1), weight("bp", 24), weight("wq", 8, 16, 1, 1)]
    nodes = [
        helper.make_node("Conv", ["x", "wd", "bd"], ["d"], group=16, pads=[2, 2, 2, 2]),
        helper.make_node("Sigmoid", ["d"], ["ds"]),
        helper.make_node("Mul", ["d", "ds"], ["a"]),
        helper.make_node("GlobalAveragePool", ["a"], ["sq"]),
        helper.make_node("Conv", ["sq", "ws"], ["s1"]),
        helper.make_node("Relu", ["s1"], ["s2"]),
        helper.make_node("Conv", ["s2", "we"], ["s3"]),
        helper.make_node("Sigmoid", ["s3"], ["gate"]),
        helper.make_node("Mul", ["a", "gate"], ["scaled"]),
        helper.make_node("Conv", ["scaled", "wp", "bp"], ["p"]),
        helper.make_node("Relu", ["p"], ["y"]),
        helper.make_node("Conv", ["a", "wq"], ["z"]),
    ]
    outs = [vi(n, TensorProto.FLOAT, [1, c, 14, 14]) for n, c in (("y", 24), ("z", 8))]
    model = make_model(nodes, [vi("x", TensorProto.FLOAT, [1, 16, 14, 14])], outs, 19, inits)
    steps = lower(model, {"x": (1, 16, 14, 14)}, gemm_epilogues=True).steps
    products = [s for s in steps if isinstance(s, MatMulStep)]
    assert len(products) == 2 and all(s.b_rows is not None and (s.b_rows.width, s.b_rows.pitch) == (14, 18) for s in products)
    assert sorted(s.b_scale is not None for s in products) == [False, True]
    assert not any(isinstance(s, KernelStep) and "operand" in s.kernel.name for s in steps)
    feeds = {"x": rng.standard_normal((1, 16, 14, 14)).astype(np.float32)}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = CompiledModel(model, CompileOptions(threads=2, cache=False))(feeds)
    for name, expected in zip(("y", "z"), want, strict=True):
        np.testing.assert_allclose(got[name], expected, rtol=1e-4, atol=1e-4, err_msg=name)
