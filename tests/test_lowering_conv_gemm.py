"""Conv as ``W @ col`` on the CPU backend's micro-kernel (unpacked B, per-row bias, ReLU, SiLU and
HardSwish epilogues), on the conv shapes of resnet18, mobilenet_v3_small and efficientnet_b0, against
onnxruntime.

Each case is ``Conv (+ Relu)`` on one input; the shapes cover 1x1 convs (widths 49 = 48 + 1, 196,
3136), strided 3x3 and 7x7 stems (implicit GEMMs over phase planes), K past one K block (4608 >
1024), and M not a multiple of the 8-row strip. Every case also checks the lowering put the bias (and the Relu) into
the product; a 7 x 7 image with 48+ output channels runs position-major (the packed micro-kernel,
bias per column). Depthwise convs (direct kernels) apply their activation as they store.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxsat.kernels.compile_options import CompileOptions
from onnxsat.kernels.compiled import CompiledModel
from onnxsat.lowering.kernel_ir import render
from onnxsat.lowering.lower import lower
from onnxsat.lowering.program import KernelStep, MatMulStep
from onnxsat.lowering.rules_nn import POSITION_MAJOR_MAX_POSITIONS, POSITION_MAJOR_MIN_CHANNELS

CASES = {
    # name: (input shape, weight shape, attributes, bias, activation after the Conv)
    "pw_7x7_512": ([1, 256, 7, 7], [512, 256, 1, 1], {}, True, "relu"),
    "pw_14x14_odd_rows": ([1, 40, 14, 14], [244, 40, 1, 1], {}, True, ""),
    "pw_56x56": ([1, 16, 56, 56], [72, 16, 1, 1], {}, True, "relu"),
    "pw_no_bias": ([1, 96, 7, 7], [576, 96, 1, 1], {}, False, ""),
    "pw_silu": ([1, 112, 14, 14], [672, 112, 1, 1], {}, True, "silu"),
    "pw_hardswish": ([1, 96, 7, 7], [576, 96, 1, 1], {}, True, "hardswish"),
    "pw_hardswish_no_bias": ([1, 16, 28, 28], [72, 16, 1, 1], {}, False, "hardswish"),
    "pw_relu_no_bias": ([1, 16, 28, 28], [24, 16, 1, 1], {}, False, "relu"),
    "se_fc_relu_no_bias": ([1, 16, 7, 7], [8, 16, 1, 1], {}, False, "relu"),
    "pw_silu_no_bias": ([1, 24, 7, 7], [40, 24, 1, 1], {}, False, "silu"),
    "dense3x3_s1": ([1, 16, 28, 28], [64, 16, 3, 3], {"pads": [1, 1, 1, 1]}, True, "relu"),  # too few channels for Winograd
    "winograd3x3_s1": ([1, 64, 28, 28], [64, 64, 3, 3], {"pads": [1, 1, 1, 1]}, True, "relu"),
    "dense3x3_s2_deep": ([1, 512, 7, 7], [20, 512, 3, 3], {"pads": [1, 1, 1, 1], "strides": [2, 2]}, True, ""),
    "stem3x3_s2_silu": ([1, 3, 48, 48], [32, 3, 3, 3], {"pads": [1, 1, 1, 1], "strides": [2, 2]}, True, "silu"),
    "stem7x7_s2": ([1, 3, 64, 64], [64, 3, 7, 7], {"pads": [3, 3, 3, 3], "strides": [2, 2]}, True, "relu"),
    "pw_strided": ([1, 32, 14, 14], [24, 32, 1, 1], {"strides": [2, 2]}, True, "relu"),
    # depthwise (direct kernels): the activation applied as the conv stores
    "dw3x3_s1_silu": ([1, 32, 14, 14], [32, 1, 3, 3], {"group": 32, "pads": [1, 1, 1, 1]}, True, "silu"),
    "dw5x5_s2_hardswish": ([1, 24, 15, 15], [24, 1, 5, 5], {"group": 24, "pads": [2, 2, 2, 2], "strides": [2, 2]}, False, "hardswish"),
    "dw3x3_s2_relu": ([1, 16, 28, 28], [16, 1, 3, 3], {"group": 16, "pads": [1, 1, 1, 1], "strides": [2, 2]}, True, "relu"),
}
MARKS = {"silu": "sigmoid(", "hardswish": "min(max(", "relu": "select(gt("}
"""What each activation looks like in a rendered kernel."""


def _nodes(name: str, rng: np.random.Generator) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto], str]:
    _, ws, attrs, bias, act = CASES[name]
    inits = [numpy_helper.from_array((rng.standard_normal(ws) / np.sqrt(np.prod(ws[1:]))).astype(np.float32), f"w_{name}")]
    inputs = [f"x_{name}", f"w_{name}"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(ws[0]).astype(np.float32), f"b_{name}"))
        inputs.append(f"b_{name}")
    c, y = f"c_{name}", f"y_{name}"
    nodes = []
    if name.startswith("se_"):
        # squeeze-excitation: the conv reads a spatial mean (a 1x1 image: dot products, no GEMM)
        nodes.append(helper.make_node("ReduceMean", [inputs[0]], [f"m_{name}"], axes=[2, 3], keepdims=1))
        inputs[0] = f"m_{name}"
    nodes.append(helper.make_node("Conv", inputs, [c], **attrs))
    if act == "relu":
        nodes.append(helper.make_node("Relu", [c], [y]))
    elif act == "hardswish":
        nodes.append(helper.make_node("HardSwish", [c], [y]))
    elif act == "silu":
        nodes += [helper.make_node("Sigmoid", [c], [f"s_{name}"]), helper.make_node("Mul", [c, f"s_{name}"], [y])]
    return nodes, inits, y if act else c


def _model(names: list[str]) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    nodes, inits, outs = [], [], []
    for name in names:
        n, i, out = _nodes(name, rng)
        nodes += n
        inits += i
        outs.append(out)
    inputs = [helper.make_tensor_value_info(f"x_{name}", TensorProto.FLOAT, CASES[name][0]) for name in names]
    graph = helper.make_graph(nodes, "conv_gemm", inputs, [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("threads", [1, 2])
def test_conv_gemm_matches_onnxruntime(threads: int, tmp_path_factory) -> None:  # type: ignore[no-untyped-def]
    """Every case in one model (compiled once), one native call, each output within tolerance."""
    names = sorted(CASES)
    model = _model(names)
    rng = np.random.default_rng(1)
    feeds = {f"x_{name}": rng.standard_normal(CASES[name][0]).astype(np.float32) for name in names}
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds), strict=True))
    cache = tmp_path_factory.getbasetemp() / "conv_gemm_cache"  # both thread counts share one cache
    cache.mkdir(mode=0o700, exist_ok=True)
    compiled = CompiledModel(model, CompileOptions(threads=threads, cache_dir=str(cache)))
    try:
        got = compiled(feeds)
        assert compiled.stats(feeds).one_native_call
    finally:
        compiled.close()
    for out, ref in want.items():
        assert got[out].shape == ref.shape, out
        assert float(np.max(np.abs(got[out] - ref))) <= 1e-4 * float(np.max(np.abs(ref))) + 1e-6, out


@pytest.mark.parametrize("name", sorted(CASES))
def test_conv_bias_and_relu_go_into_the_product(name: str) -> None:
    """The Conv's bias (and the Relu, HardSwish or SiLU reading it alone) become the product's row
    epilogue; without a bias, an activation comes with a zero bias. A squeeze-excitation layer
    (a 1x1 image) is no product but dot products."""
    _, _, attrs, bias, act = CASES[name]
    program = lower(_model([name]), {f"x_{name}": tuple(CASES[name][0])}, gemm_epilogues=True)
    products = [s for s in program.steps if isinstance(s, MatMulStep)]
    if name.startswith("se_"):  # a 1x1 image: dot products, the activation an elementwise kernel
        assert not products
        assert any(s.kernel.name.startswith("matvec_") for s in program.steps if isinstance(s, KernelStep))
        return
    if name.startswith("winograd"):  # the output transform adds the bias and applies the Relu
        assert len(products) == 36 and all(p.bias is None and not p.relu for p in products)
        assert [s.kernel.name.split("_")[0] for s in program.steps if isinstance(s, KernelStep)][1:3] == ["wgin", "wgout"]
        return
    if attrs.get("group", 1) > 1:
        convs = [s.kernel for s in program.steps if isinstance(s, KernelStep) and "conv_" in s.kernel.name]
        assert not products and len(convs) == 1
        assert MARKS[act] in render(convs[0])
        return
    assert len(products) == 1
    fused = bias or bool(act)
    out_shape, channels = CASES[name][0], CASES[name][1][0]
    positions = (out_shape[2] // attrs.get("strides", [1, 1])[0]) * (out_shape[3] // attrs.get("strides", [1, 1])[1])
    if positions <= POSITION_MAJOR_MAX_POSITIONS and channels >= POSITION_MAJOR_MIN_CHANNELS:
        # position-major: the bias per column of [positions, M], ReLU in the packed epilogue, SiLU
        # and HardSwish an elementwise kernel after it
        assert products[0].out.shape == (positions, channels) and not products[0].bias_rows
        assert (products[0].bias is not None) == fused and products[0].relu == (act == "relu") and not products[0].activation
        kernels = [render(s.kernel) for s in program.steps if isinstance(s, KernelStep)]
        assert act in ("", "relu") or any(MARKS[act] in k for k in kernels)
        return
    assert (products[0].bias is not None) == fused and products[0].bias_rows == fused
    assert products[0].relu == (act == "relu")
    assert products[0].activation == (act if act in ("silu", "hardswish") else "")


@pytest.mark.parametrize("bias", [True, False])
def test_a_squeeze_excitation_scale_is_applied_as_the_projection_packs_its_input(bias: bool) -> None:
    """MobileNetV3's and EfficientNet's squeeze-excitation: ``x * sigmoid(fc(relu(fc(pool(x)))))``
    feeding a 1x1 projection (with a bias or, as EfficientNet's dynamo export has it, none). The
    gate (one value per channel) is stored, and the projection scales B's rows by it as it packs
    them, instead of storing the scaled ``x`` first."""
    rng = np.random.default_rng(4)

    def weight(name: str, shape: list[int]) -> onnx.TensorProto:
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * 0.3, name)

    nodes = [
        helper.make_node("GlobalAveragePool", ["x"], ["pool"]),
        helper.make_node("Conv", ["pool", "w1", "b1"], ["fc1"]),
        helper.make_node("Relu", ["fc1"], ["act"]),
        helper.make_node("Conv", ["act", "w2", "b2"], ["fc2"]),
        helper.make_node("Sigmoid", ["fc2"], ["gate"]),
        helper.make_node("Mul", ["x", "gate"], ["scaled"]),
        helper.make_node("Conv", ["scaled", "w3", "b3"] if bias else ["scaled", "w3"], ["y"]),
    ]
    inits = [weight("w1", [8, 40, 1, 1]), weight("b1", [8]), weight("w2", [40, 8, 1, 1]), weight("b2", [40]), weight("w3", [24, 40, 1, 1])]
    inits += [weight("b3", [24])] if bias else []
    graph = helper.make_graph(nodes, "se", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 40, 14, 14])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    steps = lower(model, {"x": (1, 40, 14, 14)}, gemm_epilogues=True).steps
    (product,) = [s for s in steps if isinstance(s, MatMulStep)]
    assert product.b_scale is not None and product.b_scale.shape == (40,)
    assert not any("operand" in s.kernel.name for s in steps if isinstance(s, KernelStep))
    feeds = {"x": rng.standard_normal((1, 40, 14, 14)).astype(np.float32)}
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = CompiledModel(model, CompileOptions(threads=2, cache=False))(feeds)["y"]
    assert float(np.max(np.abs(got - want))) <= 1e-4 * float(np.max(np.abs(want))) + 1e-6
