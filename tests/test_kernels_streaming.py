"""Streaming vector loops (kernels/streaming.py): which loops are chosen, and that the emitted
head / non-temporal vector body / tail give the same floats as the ordinary loop, for outputs at
any alignment and ranges with odd ends. The size threshold is lowered here so small buffers take
the streaming path (one module, compiled once)."""

from __future__ import annotations

import ctypes
import platform
from collections.abc import Iterator

import numpy as np
import pytest

from onnxsat.kernels import streaming
from onnxsat.kernels.codegen import build_module, kernel_signature
from onnxsat.kernels.jit import CompiledModule
from onnxsat.lowering.interpret import interpret
from onnxsat.lowering.kernel_ir import (
    Binary,
    Buffer,
    Cast,
    Compare,
    Const,
    Expr,
    Kernel,
    Load,
    Loop,
    Select,
    Store,
    Unary,
    Var,
    add,
    i64,
    mul,
)

ROWS, COLS = 3, 1000
X = Buffer("x", "f32", (ROWS * COLS + 40,))
S = Buffer("s", "f32", (1,))
Y = Buffer("y", "f32", (ROWS * COLS,))
J, P = Var("j"), Var("p")


def _f32(v: float) -> Const:
    return Const(v, "f32")


def _row_kernel(name: str, value: Expr) -> Kernel:
    """``y[p*COLS + j] = value`` for rows p and columns j (x read at ``p*COLS + j + 7``)."""
    body = (Loop("j", i64(COLS), (Store(Y, add(mul(P, i64(COLS)), J), value),)),)
    return Kernel(name, (X, S, Y), ("y",), "p", ROWS, body)


def _two_loop_kernel() -> Kernel:
    """Two streamed sibling loops over the same variable name with different bounds."""
    row = mul(P, i64(COLS))
    first = Loop("j", i64(COLS // 2), (Store(Y, add(row, J), Binary("mul", X_AT, S_ALL)),))
    second = Loop("j", i64(COLS), (Store(Y, add(row, J), Unary("neg", X_AT)),), i64(COLS // 2))
    return Kernel("two_loops", (X, S, Y), ("y",), "p", ROWS, (first, second))


X_AT = Load(X, add(add(mul(P, i64(COLS)), J), i64(7)))
S_ALL = Load(S, i64(0))
KERNELS = {
    **{op: _row_kernel(op, Unary(op, X_AT)) for op in ("exp", "erf", "tanh", "sigmoid")},
    "silu-scale": _row_kernel("silu_scale", Binary("mul", Binary("mul", X_AT, Unary("sigmoid", X_AT)), S_ALL)),
    "relu-div-select": _row_kernel(
        "relu_div_select",
        Select(Compare("gt", X_AT, _f32(0.5)), Binary("div", X_AT, S_ALL), Binary("max", Unary("neg", X_AT), _f32(0.0))),
    ),
    "two-loops": _two_loop_kernel(),
}


@pytest.fixture(scope="module")
def modules() -> Iterator[tuple[CompiledModule, CompiledModule]]:
    """The same kernels compiled with streaming (threshold 0) and without (threshold never met)."""
    saved = streaming.STREAM_MIN_BYTES
    try:
        streaming.STREAM_MIN_BYTES = 0
        streamed = CompiledModule(build_module(list(KERNELS.values())), None)
        streaming.STREAM_MIN_BYTES = 1 << 62
        plain = CompiledModule(build_module(list(KERNELS.values())), None)
    finally:
        streaming.STREAM_MIN_BYTES = saved
    yield streamed, plain


def _run(module: CompiledModule, kernel: Kernel, x: np.ndarray, y: np.ndarray, begin: int = 0, end: int = ROWS) -> np.ndarray:
    fn = kernel_signature()(module.address(kernel.name))
    s = np.array([1.7], np.float32)
    args = (ctypes.c_void_p * 3)(x.ctypes.data, s.ctypes.data, y.ctypes.data)
    fn(args, begin, end)
    return y


def _input(infinities: bool = True) -> np.ndarray:
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(X.shape[0]) * 30).astype(np.float32)
    x[::97] = np.nan
    if infinities:
        x[5::101] = np.inf
        x[9::103] = -np.inf
    return x


def _output_at(byte_offset: int) -> np.ndarray:
    """A zeroed float32 output whose first element sits ``byte_offset`` past a 64-byte boundary."""
    raw = np.zeros(Y.nbytes + 128, np.uint8)
    start = (-raw.ctypes.data) % 64 + byte_offset
    return raw[start : start + Y.nbytes].view(np.float32)


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_streamed_loop_gives_the_same_floats_as_the_ordinary_loop(modules: tuple[CompiledModule, CompiledModule], name: str) -> None:
    """Within 2 ulp, with NaN and inf where the ordinary loop has them, at a 64-byte-aligned output,
    one needing a scalar head (4 bytes past a line) and one not float-aligned (2 bytes past: the
    whole range stays scalar). Not bit for bit: a division is a reciprocal estimate plus a Newton
    step in vector code and exact in scalar remainders, so lanes may differ by an ulp. The ordinary
    loop's math is checked against float64 in test_kernels_codegen.py."""
    streamed, plain = modules
    # -inf * sigmoid(-inf) is -inf * 0 (NaN) where the division is an estimate and -inf times a
    # denormal where it is exact, in either loop: a property of the math library, not of streaming
    kernel, x = KERNELS[name], _input(infinities=name != "silu-scale")
    want = _run(plain, kernel, x, np.zeros(Y.shape, np.float32))
    for offset in (0, 4, 2):
        got = _run(streamed, kernel, x, _output_at(offset))
        np.testing.assert_allclose(got, want, rtol=2.5e-7, atol=1e-37, err_msg=f"output {offset} bytes past a 64-byte line")
    ref = {"y": np.zeros(Y.shape, np.float32), "x": x, "s": np.array([1.7], np.float32)}
    with np.errstate(all="ignore"):
        interpret(kernel, ref)
    np.testing.assert_allclose(want, ref["y"], rtol=2e-6, atol=1e-30)


def test_streamed_kernel_writes_only_its_range(modules: tuple[CompiledModule, CompiledModule]) -> None:
    """A call for rows [1, 2) fills exactly that row: the head and tail stop at the loop's ends."""
    streamed, _ = modules
    kernel, x = KERNELS["silu-scale"], _input()
    y = _output_at(4)
    y[:] = -5.0
    _run(streamed, kernel, x, y, 1, 2)
    assert np.all(y[:COLS] == -5.0) and np.all(y[2 * COLS :] == -5.0)
    assert not np.any(y[COLS : 2 * COLS] == -5.0)


def test_streamed_loop_has_nontemporal_vector_stores_and_a_fence(modules: tuple[CompiledModule, CompiledModule]) -> None:
    streamed, plain = modules
    assert streamed.optimized_ir is not None and plain.optimized_ir is not None
    assert "!nontemporal" in streamed.optimized_ir and "!nontemporal" not in plain.optimized_ir
    if platform.machine() in ("x86_64", "AMD64"):
        assert "llvm.x86.sse.sfence" not in plain.optimized_ir
        asm = streamed.assembly()
        assert "vmovntps" in asm or "movntps" in asm
        assert "sfence" in asm


def test_which_loops_stream() -> None:
    """Only unit-stride float32 stores of large outputs whose value is lane-wise and reads no
    output; the real threshold leaves small outputs alone."""
    big = Buffer("big", "f32", (streaming.STREAM_MIN_BYTES // 4,))
    x = Buffer("x", "f32", big.shape)

    def loop(store: Store) -> Loop:
        return Loop("j", i64(100), (store,))

    chosen = Store(big, J, Binary("add", Load(x, J), Load(x, i64(3))))
    assert streaming.streamed_store(loop(chosen), frozenset({"big"})) is chosen
    assert streaming.streamed_store(loop(Store(Y, J, Load(X, J))), frozenset({"y"})) is None  # small output
    assert streaming.streamed_store(loop(Store(big, mul(J, i64(2)), Load(x, J))), frozenset({"big"})) is None  # stride 2
    assert streaming.streamed_store(loop(Store(big, J, Load(x, mul(J, i64(2))))), frozenset({"big"})) is None  # gather
    assert streaming.streamed_store(loop(Store(big, J, Load(big, add(J, i64(1))))), frozenset({"big"})) is None  # reads output
    assert streaming.streamed_store(loop(Store(big, J, Cast(J, "f32"))), frozenset({"big"})) is None  # iota
    assert streaming.streamed_store(loop(Store(big, J, Unary("log", Load(x, J)))), frozenset({"big"})) is None  # libm call
    assert streaming.stride_of(add(mul(P, i64(COLS)), add(J, i64(-3))), "j") == 1
    assert streaming.stride_of(Binary("sub", i64(10), J), "j") == -1
    assert streaming.stride_of(Binary("min", J, i64(4)), "j") is None
