"""A register-blocked float32 GEMM micro-kernel written with ``llvmlite.ir.IRBuilder``.

``C[M, N] = A[M, K] @ B[K, N]`` with B packed once (weights are packed at compile time) into
panels of 48 columns: ``Bp[panel][k][0:48]``, zero-padded past N. With AVX-512 the micro-kernel
keeps an 8x48 block of C in twenty-four 16-lane accumulators and, per k, broadcasts eight A values
against three B vectors (FMA; 8 rows divide the BERT and MLP row counts, so they run no short
strips); with AVX2 (16 registers of 8 floats) it takes the panel in a loop of 6x16 passes
(``tile_vectors``). The k loop
is unrolled by four and each row of A has its own base pointer, so the loop body is FMAs, loads
and a prefetch of the weights ``PREFETCH_ROWS`` ahead (the earlier one-step loop with a chained
row index ran 4-8% slower, CPU time per call on the MLP and BERT-128 products); a short last strip repeats its last row and stores only its own rows,
leftover columns use masked stores. Loops go K block, row block (``MC``), panel, micro-tile
(BLIS's order, without packing A: packing inside each panel-range task cost more than it saved
when N is split eight ways). The function
takes a ``[p_begin, p_end)`` range of panels so the runtime can split N over threads.

Epilogues: ``onnxsat_sgemm_packed_bias`` adds a bias row and ``..._bias_relu`` also clamps at zero,
both while the last K block's C tile is still in registers (MatMul + Add (+ Relu) without a
second pass over C). The bias lives right after the panels in the packed buffer (``pack_b(b,
bias)``), zero-padded to whole panels, so the function keeps the ten-integer signature the native
task table calls.

Two more forms share the micro-kernel: the unpacked-B form (``ROWS_ARGS``: a conv's ``W @ col``
packing shifted windows of its input as it goes) and the channel-blocked store (``BLOCKED_ARGS``:
a pointwise conv's position-major product stored straight into a depthwise conv's NCHWc input).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import numpy as np
from llvmlite import ir

from .jit import LoadedObjects, host_target, support_code
from .llvm_loops import for_range
from .mathlib import sigmoid_f32

NR = 48
"""Columns per packed panel (three 16-lane vectors): 8 x 48 keeps 24 accumulators, 3 B vectors and
a broadcast in the 32 vector registers; it measured 3-12% less CPU time per call than 8 x 32 on
the MLP, BERT-128 and BERT-512 products (12 x 32 was slower on the MLP's 64 rows)."""
WIDE_VECTORS = "+avx512f" in host_target().features.split(",")
"""The host has 32 vector registers of 16 floats (AVX-512); without, 16 of 8 (AVX2), where each
16-lane vector of the IR takes two."""
MR = 8 if WIDE_VECTORS else 6
"""Rows per micro-kernel call (a strip)."""
KC = 1024
"""Depth of one K block (a 192 KiB slice of a packed panel, read from L2). Deeper blocks reload and
store each C tile less often: against 256, CPU time per single-threaded call fell 7-8% on the MLP's
64x1024x4096, 10-13% on BERT-512's FFN products and 8% on 128x768x768 (interleaved, four runs on a
loaded machine; 768 and whole-K measured about the same)."""
MC = 192
"""Rows of A per row block: a 192 x 1024 block of A (768 KiB) stays in L2 while every panel of the
call passes by, so A is read from memory once per K block instead of once per panel (the FFN
products of BERT, whose A or C outgrow L2, ran at half the speed of the 768x768 ones)."""
UNROLL = 4
"""K steps per iteration of the micro-kernel's inner loop (loop overhead off the FMA ports)."""
LANES = 16
PREFETCH_ROWS = 32
"""The micro-kernel prefetches the packed weights this many k rows (6 KiB) ahead into L1: with
1024-deep K blocks the panel slice comes from L2, and the prefetch cut CPU time per single-threaded
call by 3-9% on the MLP and BERT products (interleaved, two runs on a loaded machine; 8 rows
helped less, 64 about the same). Prefetches past the panel's end are harmless hints."""


ACTIVATIONS = ("bias_silu", "bias_hardswish")
"""Epilogues with an activation past ReLU (a polynomial or clamps on each value)."""
ACTIVATE_IN_REGISTERS = not WIDE_VECTORS
"""SiLU and HardSwish epilogues applied to the accumulators before the store (AVX2: a 6 x 16 tile,
six polynomials), not as a second loop over the stored tile (AVX-512, whose 8 x 48 tile made
24 copies of the polynomial and several times the compile time). One Zen 3 thread, in-process A/B:
HardSwish 1.08-1.37x faster (blocked and implicit-conv products of MobileNetV3's shapes), SiLU
0.98-1.12x (EfficientNet's; the largest, 12544 x 16 x 96, 1.12x)."""


def tile_vectors(mr: int) -> int:
    """16-lane vectors of a panel one pass of an ``mr``-row micro-kernel keeps in registers: AVX-512
    the whole panel (8 x 3 accumulators), AVX2 a third at a time (6 x 1 accumulators are 12 of its
    16 registers, with two for B and one for the broadcast; the 8 x 3 tile, 48 registers there,
    spilled: 20-23 GFLOP/s a core on Zen 3, 64-70 with 6 x 1), or the whole panel for one row."""
    return NR // LANES if WIDE_VECTORS or mr == 1 else 1


F32 = ir.FloatType()
I64 = ir.IntType(64)
I1 = ir.IntType(1)
VEC = ir.VectorType(F32, LANES)
MASK = ir.VectorType(I1, LANES)
PTR = F32.as_pointer()


EPILOGUES = {"none": "onnxsat_sgemm_packed", "bias": "onnxsat_sgemm_packed_bias", "bias_relu": "onnxsat_sgemm_packed_bias_relu"}
"""Epilogue name -> function name; every variant takes the ten integer arguments ``ARGS``."""
ARGS = ("a", "lda", "bp", "k", "c", "ldc", "m", "n", "p_begin", "p_end")
ROWS_ARGS = ("a", "lda", "bp", "b_rows", "b_scale", "k", "c", "ldc", "m", "n", "p_begin", "p_end", "width", "pitch")
"""The unpacked-B form's arguments: ``b_rows`` holds K offsets (elements from ``bp``), where each
row of B starts. Rows N apart are a stored B (``k * N``); an implicit-GEMM convolution's rows are
shifted windows of its padded input (``program.ShiftedRows``), so it needs no im2col copy.
``b_scale`` (K floats, or null) multiplies each row of B as it is packed: a squeeze-excitation's
channel scale, applied to the 1x1 conv's input without a pass of its own over it. Column ``q`` of
a row is ``width`` apart from the row's start plus ``(q // width) * (pitch - width)``: an implicit
conv's output rows (``width`` columns) read input rows ``pitch`` apart, so the columns of the
padding between them are neither packed nor computed; ``width == pitch``: contiguous columns."""
PIECES = 3
"""Input rows one 16-lane vector of B's columns may span (a ``width`` of 8 or more): each is one
masked load into the vector."""
BLOCKED_EPILOGUES = {
    "none": "onnxsat_sgemm_blocked",
    "bias": "onnxsat_sgemm_blocked_bias",
    "bias_relu": "onnxsat_sgemm_blocked_bias_relu",
    "bias_silu": "onnxsat_sgemm_blocked_bias_silu",
    "bias_hardswish": "onnxsat_sgemm_blocked_bias_hardswish",
}
"""The packed form storing C channel-blocked (``BLOCKED_ARGS``): rows of C are image positions,
columns channels, and C goes straight into the zero-padded [C/block, Hp, Wp, block] (NCHWc) buffer
a blocked depthwise conv reads, so a pointwise conv feeding one needs no reorder pass."""
BLOCKED_ARGS = (*ARGS, "c_rows", "block", "a_step")
"""``ARGS`` plus where each row of C lies: element ``(i, j)`` is stored at ``c + c_rows[i] +
(j // block) * ldc + j % block`` (``c_rows[i]``: row ``i``'s padded position times ``block``;
``ldc``: one channel block's plane, ``Hp * Wp * block``; ``block``: 8 or 16 channels), and A's
column stride: ``A[i, k]`` is at ``a + i * lda + k * a_step`` (an NCHW image read as positions x
channels: ``lda`` 1, ``a_step`` the plane; eight rows' values of one k then share a cache line)."""
POINTER_ARGS = frozenset({"a", "bp", "c", "b_rows", "b_scale", "c_rows"})
"""The arguments that are addresses (the others are int64)."""
ROW_EPILOGUES = {
    "none": "onnxsat_sgemm_rows",
    "bias": "onnxsat_sgemm_rows_bias",
    "bias_relu": "onnxsat_sgemm_rows_bias_relu",
    "bias_silu": "onnxsat_sgemm_rows_bias_silu",
    "bias_hardswish": "onnxsat_sgemm_rows_bias_hardswish",
}
"""The same epilogues for the unpacked-B form (a Conv's ``W @ col``): ``bp`` is then B itself, K rows
of N values at the offsets ``b_rows`` (see ``ROWS_ARGS``), and the bias is per row of C, read from column K of A (A is the
constant weight, stored M x (K + 1) with the bias as its last column, so a task that starts at a
later row finds its bias with its rows). SiLU (``x * sigmoid(x)``, mathlib's vector sigmoid) and
HardSwish (``x * clamp(x / 6 + 1/2, 0, 1)``) follow the bias as MobileNet's and EfficientNet's
convs need, so their activation is not a pass of its own over C."""


def rows_a(a: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """A (M x K) for the unpacked-B kernels: with ``bias`` (M values) as an extra column K."""
    m, k = a.shape
    out = np.empty((m, k + (bias is not None)), np.float32)
    out[:, :k] = a
    if bias is not None:
        out[:, k] = np.asarray(bias, np.float32).reshape(m)
    return out


def pack_b(b: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """``b`` (K x N) as zero-padded ``NR``-column panels, contiguous: shape (panels, K, NR), starting
    on a 64-byte boundary so no vector load of B straddles two cache lines (numpy's own buffers
    start 16 bytes into a line; aligned panels measured 0-3% faster per call). With ``bias`` (N
    values) the buffer continues with the bias, zero-padded to ``panels * NR``, where the bias
    epilogues find it (the returned array still has the panels' shape)."""
    k, n = b.shape
    panels = -(-n // NR)
    padded = np.zeros((k, panels * NR), np.float32)
    padded[:, :n] = b
    extra = panels * NR if bias is not None else 0
    raw = np.empty((panels * k * NR + extra) * 4 + 64, np.uint8)
    start = (-raw.ctypes.data) % 64
    flat = raw[start : start + (panels * k * NR + extra) * 4].view(np.float32)
    packed = flat[: panels * k * NR].reshape(panels, k, NR)
    packed[...] = padded.reshape(k, panels, NR).transpose(1, 0, 2)
    if bias is not None:
        flat[panels * k * NR :] = 0.0
        flat[panels * k * NR : panels * k * NR + n] = np.asarray(bias, np.float32).reshape(n)
    return packed


class _Gen:
    def __init__(self, module: ir.Module, epilogue: str = "none", packed: bool = True, blocked: bool = False):
        self.module = module
        self.epilogue = epilogue
        self.packed = packed
        """False: B is unpacked (rows at the offsets ``b_rows``, masked loads), the bias is per row (A's column K),
        and a panel's last columns run with only as many vectors as they need."""
        self.blocked = blocked
        """C stored channel-blocked (``BLOCKED_ARGS``; packed form only)."""
        names = BLOCKED_ARGS if blocked else ARGS if packed else ROWS_ARGS
        fnty = ir.FunctionType(ir.VoidType(), [(I64.as_pointer() if name in ("b_rows", "c_rows") else PTR) if name in POINTER_ARGS else I64 for name in names])
        self.fn = ir.Function(module, fnty, (BLOCKED_EPILOGUES if blocked else EPILOGUES if packed else ROW_EPILOGUES)[epilogue])
        self.arg: dict[str, ir.Argument] = {}
        for arg, name in zip(self.fn.args, names, strict=True):
            arg.name = name
            self.arg[name] = arg
        self.entry = self.fn.append_basic_block("entry")
        self.b = ir.IRBuilder(self.entry)
        i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
        self.fma = _intrinsic(module, ir.FunctionType(VEC, [VEC, VEC, VEC]), "llvm.fma.v16f32")
        self.mload = _intrinsic(module, ir.FunctionType(VEC, [VEC.as_pointer(), i32, MASK, VEC]), "llvm.masked.load.v16f32.p0")
        self.prefetch = _intrinsic(module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]), "llvm.prefetch.p0")
        self.mstore = _intrinsic(module, ir.FunctionType(ir.VoidType(), [VEC, VEC.as_pointer(), i32, MASK]), "llvm.masked.store.v16f32.p0")

    def splat(self, value: ir.Value) -> ir.Value:
        """``value`` in every lane of a vector."""
        b = self.b
        undef = ir.Constant(VEC, None)
        return b.shuffle_vector(b.insert_element(undef, value, ir.Constant(ir.IntType(32), 0)), undef, ir.Constant(ir.VectorType(ir.IntType(32), LANES), [0] * LANES))

    def alloca(self, ty: ir.Type, name: str) -> ir.Value:
        with self.b.goto_block(self.entry):
            self.b.position_at_start(self.entry)
            return self.b.alloca(ty, name=name)

    def loop(self, name: str, start: ir.Value, stop: ir.Value, step: int, body) -> None:  # type: ignore[no-untyped-def]
        b = self.b
        var = self.alloca(I64, name)
        blocks = (f"{name}.head", f"{name}.body", f"{name}.done")
        for_range(b, var, start, stop, _i64(step), lambda _: body(b.load(var)), blocks=blocks, nsw=False)

    def build(self) -> None:
        bp, k, m, n, p_begin, p_end = (self.arg[name] for name in ("bp", "k", "m", "n", "p_begin", "p_end"))
        b = self.b
        lanes = ir.Constant(ir.VectorType(I64, LANES), list(range(LANES)))
        zero = ir.Constant(VEC, [0.0] * LANES)
        if not self.packed:
            self.pack = b.bitcast(self.alloca(ir.ArrayType(F32, KC * NR), "pack"), PTR)
            self.scaled = b.icmp_unsigned("!=", b.ptrtoint(self.arg["b_scale"], I64), _i64(0))
        total_panels = b.sdiv(b.add(n, _i64(NR - 1)), _i64(NR))
        self.bias = b.gep(bp, [b.mul(total_panels, b.mul(k, _i64(NR)))])  # read by the epilogues only

        def k_block(k0: ir.Value) -> None:
            # KC rows of a panel (192 KiB) stay in L2 while the row block's micro-tiles pass by
            end = b.add(k0, _i64(KC))
            k1 = b.select(b.icmp_signed("<", end, k), end, k)
            first = b.icmp_signed("==", k0, _i64(0))
            self.last_block = b.icmp_signed("==", k1, k)

            def row_block(r0: ir.Value) -> None:
                r_end = b.add(r0, _i64(MC))
                r_end = b.select(b.icmp_signed("<", r_end, m), r_end, m)
                strips = b.sdiv(b.add(b.sub(r_end, r0), _i64(MR - 1)), _i64(MR))

                def panel(p: ir.Value) -> None:
                    col0 = b.mul(p, _i64(NR))
                    left = b.sub(n, col0)
                    masks = []
                    for half in range(NR // LANES):
                        limit = b.sub(left, _i64(half * LANES))
                        masks.append(b.icmp_signed("<", lanes, self.splat_i64(limit)))
                    if self.packed:
                        b_panel = b.gep(bp, [b.mul(p, b.mul(k, _i64(NR)))])

                        def strip(s: ir.Value) -> None:
                            i0 = b.add(r0, b.mul(s, _i64(MR)))
                            rows = b.sub(r_end, i0)
                            # one row (a classifier's or a decode step's product): one row of FMAs,
                            # not eight copies of it (the weights then stream at memory speed); two
                            # to four rows (a batch of a few): four
                            with b.if_else(b.icmp_signed("==", rows, _i64(1))) as (one, many):
                                with one:
                                    self.block(i0, rows, col0, b_panel, masks, (k0, k1, first), mr=1)
                                with many:
                                    with b.if_else(b.icmp_signed("<=", rows, _i64(4))) as (few, full):
                                        with few:
                                            self.block(i0, rows, col0, b_panel, masks, (k0, k1, first), mr=4)
                                        with full:  # a short last panel: only the vectors it has (16 columns: one)
                                            self.vectors(left, lambda width: self.block(i0, rows, col0, b_panel, masks, (k0, k1, first), width))

                        self.loop("s", _i64(0), strips, 1, strip)
                        return
                    # the panel's K block copied to a contiguous buffer once (masked past N) and
                    # read by every strip of the row block: B's rows are N apart, and strided
                    # loads ran at 0.7-0.85 of OpenBLAS on resnet18's products
                    four = ir.Constant(ir.IntType(32), 4)
                    width, pitch = self.arg["width"], self.arg["pitch"]

                    def pack(pieces: list[list[tuple[ir.Value, ir.Value]]]) -> None:
                        """Each vector of the panel's row as masked loads at (offset, mask) pieces."""

                        def pack_row(kk: ir.Value) -> None:
                            row = b.gep(bp, [b.load(b.gep(self.arg["b_rows"], [kk]))])
                            dst = b.gep(self.pack, [b.mul(b.sub(kk, k0), _i64(NR))])

                            def copy(scaled: bool) -> None:
                                factor = self.splat(b.load(b.gep(self.arg["b_scale"], [kk]))) if scaled else None
                                for h, vector in enumerate(pieces):
                                    v = zero
                                    for offset, mask in vector:
                                        v = b.call(self.mload, [b.bitcast(b.gep(row, [offset]), VEC.as_pointer()), four, mask, v])
                                    if factor is not None:
                                        v = b.fmul(v, factor)
                                    b.store(v, b.bitcast(b.gep(dst, [_i64(h * LANES)]), VEC.as_pointer()), align=4)

                            with b.if_else(self.scaled) as (then, otherwise):  # loop-invariant: unswitched
                                with then:
                                    copy(True)
                                with otherwise:
                                    copy(False)

                        self.loop("pk", k0, k1, 1, pack_row)

                    def gapped(pieces: int) -> None:
                        pack([self.row_pieces(b.add(col0, _i64(h * LANES)), masks[h], width, pitch, pieces) for h in range(NR // LANES)])

                    with b.if_else(b.icmp_signed("==", width, pitch)) as (contiguous, skipping):
                        with contiguous:
                            pack([[(b.add(col0, _i64(h * LANES)), masks[h])] for h in range(NR // LANES)])
                        with skipping:  # a vector spans two input rows at most from 16 columns a row
                            with b.if_else(b.icmp_signed(">=", width, _i64(LANES))) as (wide, narrow_rows):
                                with wide:
                                    gapped(2)
                                with narrow_rows:
                                    gapped(PIECES)
                    b_panel = b.gep(self.pack, [b.sub(_i64(0), b.mul(k0, _i64(NR)))])

                    def narrow(width: int | ir.Value) -> None:
                        def strip(s: ir.Value) -> None:
                            i0 = b.add(r0, b.mul(s, _i64(MR)))
                            self.block(i0, b.sub(r_end, i0), col0, b_panel, masks, (k0, k1, first), width)

                        self.loop("s", _i64(0), strips, 1, strip)

                    # a short last panel does as many vectors of FMAs as it has columns (49 = 48 + 1:
                    # one, not three; an implicit conv's 224 = 4 x 48 + 32: two)
                    self.vectors(left, narrow)

                self.loop("p", p_begin, p_end, 1, panel)

            self.loop("ic", _i64(0), m, MC, row_block)

        self.loop("kc", _i64(0), k, KC, k_block)
        b.ret_void()

    def row_pieces(self, q0: ir.Value, mask: ir.Value, width: ir.Value, pitch: ir.Value, count: int) -> list[tuple[ir.Value, ir.Value]]:
        """Where the 16 columns from ``q0`` lie in a row of B whose columns skip ``pitch - width``
        values after every ``width``: for each of the ``count`` input rows they may span, the
        offset of lane 0 and the lanes that row fills (within ``mask``)."""
        b = self.b
        lanes = ir.Constant(ir.VectorType(I64, LANES), list(range(LANES)))
        first = b.sdiv(q0, width)
        pieces = []
        for p in range(count):
            r = b.add(first, _i64(p))
            lo = b.sub(b.mul(r, width), q0)  # lane where input row r starts
            inside = b.and_(b.icmp_signed(">=", lanes, self.splat_i64(lo)), b.icmp_signed("<", lanes, self.splat_i64(b.add(lo, width))))
            pieces.append((b.add(q0, b.mul(r, b.sub(pitch, width))), b.and_(inside, mask)))
        return pieces

    def splat_i64(self, value: ir.Value) -> ir.Value:
        b = self.b
        ty = ir.VectorType(I64, LANES)
        return b.shuffle_vector(b.insert_element(ir.Constant(ty, None), value, ir.Constant(ir.IntType(32), 0)), ir.Constant(ty, None), ir.Constant(ir.VectorType(ir.IntType(32), LANES), [0] * LANES))

    def vectors(self, left: ir.Value, body) -> None:  # type: ignore[no-untyped-def]
        """``body(width)`` for a panel with ``left`` columns to go: ``width`` the vectors it has (1 to
        3): a constant in each of three branches with AVX-512 (one tile of that width), a runtime
        count with AVX2, whose one-vector passes loop (``block``): three unrolled copies of every
        path tripled the micro-kernel's code and cold compile."""
        b = self.b
        if WIDE_VECTORS:
            with b.if_else(b.icmp_signed(">", left, _i64(2 * LANES))) as (three, fewer):
                with three:
                    body(NR // LANES)
                with fewer:
                    with b.if_else(b.icmp_signed(">", left, _i64(LANES))) as (two, one):
                        with two:
                            body(2)
                        with one:
                            body(1)
            return
        count = b.sdiv(b.add(left, _i64(LANES - 1)), _i64(LANES))
        body(b.select(b.icmp_signed("<", count, _i64(NR // LANES)), count, _i64(NR // LANES)))

    def block(
        self, i0: ir.Value, rows: ir.Value, col0: ir.Value, b_panel: ir.Value, masks: list[ir.Value], span: tuple[ir.Value, ir.Value, ir.Value],
        width: int | ir.Value = NR // LANES,
        mr: int = MR,
    ) -> None:
        """The panel's first ``width`` vectors of columns as passes of ``tile_vectors(mr)`` (``tile``);
        one-vector passes run as a loop (``width`` may then be a runtime count)."""
        b = self.b
        step = tile_vectors(mr)
        if step == 1:
            count = width if isinstance(width, ir.Value) else _i64(width)

            def one_pass(h: ir.Value) -> None:
                sub_col0 = b.add(col0, b.mul(h, _i64(LANES)))
                mask = b.icmp_signed("<", ir.Constant(ir.VectorType(I64, LANES), list(range(LANES))), self.splat_i64(b.sub(self.arg["n"], sub_col0)))
                self.tile(i0, rows, sub_col0, b.gep(b_panel, [b.mul(h, _i64(LANES))]), [mask], span, 1, mr)

            self.loop("pass", _i64(0), count, 1, one_pass)
            return
        assert isinstance(width, int)
        for h0 in range(0, width, step):
            part = min(step, width - h0)
            sub_col0 = b.add(col0, _i64(h0 * LANES))
            sub_panel = b.gep(b_panel, [_i64(h0 * LANES)])
            self.tile(i0, rows, sub_col0, sub_panel, masks[h0 : h0 + part], span, part, mr)

    def tile(
        self, i0: ir.Value, rows: ir.Value, col0: ir.Value, b_panel: ir.Value, masks: list[ir.Value], span: tuple[ir.Value, ir.Value, ir.Value],
        width: int,
        mr: int,
    ) -> None:
        """C[i0:i0+min(rows, mr), col0:col0+16 width] (+)= A[.., k0:k1] @ Bp[panel, k0:k1] (``b_panel``
        and ``masks`` start at ``col0``'s vector; B's rows are ``NR`` apart); the first K block
        starts from zero, later ones from what C holds. A short last strip (``rows < mr``) reads
        its last row again in place of the missing ones and stores only its own rows."""
        a, lda = self.arg["a"], self.arg["lda"]
        k0, k1, first = span
        b = self.b
        zero = ir.Constant(VEC, [0.0] * LANES)
        accs = [[self.alloca(VEC, f"acc{r}_{h}") for h in range(width)] for r in range(mr)]
        last = b.sub(rows, _i64(1))
        present = [b.icmp_signed(">", rows, _i64(r)) for r in range(mr)]

        for row in accs:
            for slot in row:
                b.store(zero, slot)
        with b.if_then(b.not_(first)):
            for r in range(mr):
                with b.if_then(present[r]):
                    for h in range(width):
                        b.store(self.load_c(b.add(i0, _i64(r)), col0, h, masks[h]), accs[r][h])
        # one base pointer per row: the unrolled k steps then address A as base + k (no index chain)
        a_rows = [b.gep(a, [b.mul(b.add(i0, b.select(present[r], _i64(r), last)), lda)]) for r in range(mr)]

        def steps(k_at: ir.Value, count: int) -> None:
            acc = [[b.load(slot) for slot in row] for row in accs]
            for u in range(count):
                kk = b.add(k_at, _i64(u))
                brow = b.gep(b_panel, [b.mul(kk, _i64(NR))])
                bv = [b.load(b.bitcast(b.gep(brow, [_i64(h * LANES)]), VEC.as_pointer()), align=4) for h in range(width)]
                if PREFETCH_ROWS and self.packed:
                    for h in range(width):
                        ahead = b.bitcast(b.gep(brow, [_i64(PREFETCH_ROWS * NR + h * LANES)]), ir.IntType(8).as_pointer())
                        b.call(self.prefetch, [ahead, ir.Constant(ir.IntType(32), 0), ir.Constant(ir.IntType(32), 3), ir.Constant(ir.IntType(32), 1)])
                a_at = b.mul(kk, self.arg["a_step"]) if self.blocked else kk
                for r in range(mr):
                    av = b.load(b.gep(a_rows[r], [a_at]))
                    splat = self.splat(av)
                    for h in range(width):
                        acc[r][h] = b.call(self.fma, [splat, bv[h], acc[r][h]])
            for r in range(mr):
                for h in range(width):
                    b.store(acc[r][h], accs[r][h])

        main_end = b.add(k0, b.mul(b.sdiv(b.sub(k1, k0), _i64(UNROLL)), _i64(UNROLL)))
        self.loop("ku", k0, main_end, UNROLL, lambda kk: steps(kk, UNROLL))
        self.loop("kt", main_end, k1, 1, lambda kk: steps(kk, 1))
        looped = self.epilogue in ACTIVATIONS and not ACTIVATE_IN_REGISTERS
        if self.epilogue != "none" and (self.packed or not looped):
            with b.if_then(self.last_block):
                if self.packed:  # the bias row (and ReLU); SiLU / HardSwish follow the store
                    self.apply_epilogue(accs, col0)
                else:
                    self.apply_row_epilogue(accs, a_rows)
        for r in range(mr):
            with b.if_then(present[r]):
                for h in range(width):
                    self.store_c(b.load(accs[r][h]), b.add(i0, _i64(r)), col0, h, masks[h])
        if looped:
            with b.if_then(self.last_block):
                self.activate_stored(i0, rows, col0, masks, width)

    def _c_places(self, i: ir.Value, col0: ir.Value, h: int, mask: ir.Value) -> list[tuple[ir.Value, ir.Value]]:
        """Where the 16 values of row ``i`` from column ``col0 + 16 h`` are stored: (vector
        address, lanes) pairs, one for a dense C, two for a blocked one: the 16-channel block at
        the first address (all lanes) or 8-channel blocks at both (the second address shifted
        back 8 lanes, so lane 8 starts the next block)."""
        b = self.b
        c, ldc = self.arg["c"], self.arg["ldc"]
        j0 = b.add(col0, _i64(h * LANES))
        if not self.blocked:
            return [(b.bitcast(b.gep(c, [b.add(b.mul(i, ldc), j0)]), VEC.as_pointer()), mask)]
        block = self.arg["block"]
        row = b.gep(c, [b.load(b.gep(self.arg["c_rows"], [i]))])
        shift = b.select(b.icmp_signed("==", block, _i64(8)), _i64(3), _i64(4))  # j0 // block, no division
        first = b.gep(row, [b.mul(b.lshr(j0, shift), ldc)])
        lanes = ir.Constant(ir.VectorType(I64, LANES), list(range(LANES)))
        low = b.icmp_signed("<", lanes, self.splat_i64(block))
        second = b.gep(first, [b.sub(ldc, block)])
        return [(b.bitcast(first, VEC.as_pointer()), b.and_(mask, low)), (b.bitcast(second, VEC.as_pointer()), b.and_(mask, b.not_(low)))]

    def load_c(self, i: ir.Value, col0: ir.Value, h: int, mask: ir.Value) -> ir.Value:
        """Row ``i``'s 16 values of C from column ``col0 + 16 h`` (zero outside ``mask``); whole
        vectors with plain loads, as ``store_c`` stores them."""
        b = self.b
        four = ir.Constant(ir.IntType(32), 4)
        places = self._c_places(i, col0, h, mask)
        slot = self.alloca(VEC, "c_value")
        with b.if_else(self.whole(col0, h)) as (plain, masked):
            with plain:
                if len(places) == 1:
                    b.store(b.load(places[0][0], align=4), slot)
                else:
                    with b.if_else(self.eight_lane_blocks()) as (eights, sixteen):
                        with eights:
                            low, high = (b.load(self.half_vector(address, half), align=4) for half, (address, _) in enumerate(places))
                            b.store(b.shuffle_vector(low, high, ir.Constant(ir.VectorType(ir.IntType(32), LANES), list(range(LANES)))), slot)
                        with sixteen:
                            b.store(b.load(places[0][0], align=4), slot)
            with masked:
                value = b.call(self.mload, [places[0][0], four, places[0][1], ir.Constant(VEC, [0.0] * LANES)])
                b.store(value, slot)
                if len(places) > 1:
                    with b.if_then(self.eight_lane_blocks()):  # the second 8-channel block
                        b.store(b.call(self.mload, [places[1][0], four, places[1][1], value]), slot)
        return b.load(slot)

    def whole(self, col0: ir.Value, h: int) -> ir.Value:
        """Whether the vector of C from column ``col0 + 16 h`` lies wholly inside N."""
        return self.b.icmp_signed("<=", self.b.add(col0, _i64((h + 1) * LANES)), self.arg["n"])

    def half_vector(self, address: ir.Value, half: int) -> ir.Value:
        """The 8-lane vector where lanes ``8 half ..`` of a 16-lane vector at ``address`` lie (the
        second place of an 8-channel blocked C is shifted back 8 lanes)."""
        start = self.b.gep(self.b.bitcast(address, PTR), [_i64(half * 8)])
        return self.b.bitcast(start, ir.VectorType(F32, 8).as_pointer())

    def store_c(self, value: ir.Value, i: ir.Value, col0: ir.Value, h: int, mask: ir.Value) -> None:
        """Store ``value`` as row ``i``'s 16 values of C from column ``col0 + 16 h`` (lanes in ``mask``).
        Whole vectors take plain stores: AVX2 has no cheap masked store (``vmaskmovps`` to memory
        is microcoded on Zen 3), and the short-K products of MobileNet and EfficientNet spent most
        of their time in them."""
        b = self.b
        four = ir.Constant(ir.IntType(32), 4)
        places = self._c_places(i, col0, h, mask)
        with b.if_else(self.whole(col0, h)) as (plain, masked):
            with plain:
                if len(places) == 1:
                    b.store(value, places[0][0], align=4)
                else:
                    with b.if_else(self.eight_lane_blocks()) as (eights, sixteen):
                        with eights:
                            for half, (address, _) in enumerate(places):
                                part = b.shuffle_vector(value, value, ir.Constant(ir.VectorType(ir.IntType(32), 8), list(range(half * 8, half * 8 + 8))))
                                b.store(part, self.half_vector(address, half), align=4)
                        with sixteen:
                            b.store(value, places[0][0], align=4)
            with masked:
                b.call(self.mstore, [value, places[0][0], four, places[0][1]])  # a dense row, or the (first) channel block
                if len(places) > 1:
                    with b.if_then(self.eight_lane_blocks()):  # the second 8-channel block
                        b.call(self.mstore, [value, places[1][0], four, places[1][1]])

    def eight_lane_blocks(self) -> ir.Value:
        return self.b.icmp_signed("==", self.arg["block"], _i64(8))

    def apply_epilogue(self, accs: list[list[ir.Value]], col0: ir.Value) -> None:
        """The finished tile plus the bias row (zero-padded past N: aligned, unmasked loads), then
        ReLU as ``x < 0 ? 0 : x`` (NaN stays NaN, as in ONNX's Relu), or SiLU / HardSwish where
        ``ACTIVATE_IN_REGISTERS``."""
        b = self.b
        zero = ir.Constant(VEC, [0.0] * LANES)
        brow = b.gep(self.bias, [col0])
        bias = [b.load(b.bitcast(b.gep(brow, [_i64(h * LANES)]), VEC.as_pointer()), align=4) for h in range(len(accs[0]))]
        for row in accs:
            for h, slot in enumerate(row):
                value = b.fadd(b.load(slot), bias[h])
                if self.epilogue == "bias_relu":
                    value = b.select(b.fcmp_ordered("<", value, zero), zero, value)
                elif ACTIVATE_IN_REGISTERS and self.epilogue in ACTIVATIONS:
                    value = self.activate(value)
                b.store(value, slot)


    def activate_stored(self, i0: ir.Value, rows: ir.Value, col0: ir.Value, masks: list[ir.Value], width: int) -> None:
        """SiLU / HardSwish epilogues on the tile just stored, row by row in a loop (C is in L1;
        AVX-512 only, see ``ACTIVATE_IN_REGISTERS``). The unpacked form adds its row bias (A's column K) here too;
        the packed form added its bias row in registers."""
        b = self.b
        a, lda, k = (self.arg[name] for name in ("a", "lda", "k"))
        count = b.select(b.icmp_signed("<", rows, _i64(MR)), rows, _i64(MR))

        def row(r: ir.Value) -> None:
            i = b.add(i0, r)
            splat = None if self.packed else self.splat(b.load(b.gep(a, [b.add(b.mul(i, lda), k)])))
            for h in range(width):
                value = self.load_c(i, col0, h, masks[h])
                if splat is not None:
                    value = b.fadd(value, splat)
                self.store_c(self.activate(value), i, col0, h, masks[h])

        self.loop("er", _i64(0), count, 1, row)

    def activate(self, value: ir.Value) -> ir.Value:
        """SiLU (``x * sigmoid(x)``) or HardSwish (``x * clamp(x / 6 + 1/2, 0, 1)``) of ``value``."""
        b = self.b
        if self.epilogue == "bias_silu":
            return b.fmul(value, sigmoid_f32(b, value))
        assert self.epilogue == "bias_hardswish"
        zero, one = ir.Constant(VEC, [0.0] * LANES), ir.Constant(VEC, [1.0] * LANES)
        gate = b.fadd(b.fmul(value, ir.Constant(VEC, [1.0 / 6.0] * LANES)), ir.Constant(VEC, [0.5] * LANES))
        gate = b.select(b.fcmp_ordered("<", gate, zero), zero, gate)
        gate = b.select(b.fcmp_ordered(">", gate, one), one, gate)
        return b.fmul(value, gate)

    def apply_row_epilogue(self, accs: list[list[ir.Value]], a_rows: list[ir.Value]) -> None:
        """The finished tile plus each row's bias (column K of A), then the activation as in ``apply_epilogue``."""
        b = self.b
        k = self.arg["k"]
        zero = ir.Constant(VEC, [0.0] * LANES)
        for r, row in enumerate(accs):
            bias = b.load(b.gep(a_rows[r], [k]))
            splat = self.splat(bias)
            for slot in row:
                value = b.fadd(b.load(slot), splat)
                if self.epilogue == "bias_relu":
                    value = b.select(b.fcmp_ordered("<", value, zero), zero, value)
                elif ACTIVATE_IN_REGISTERS and self.epilogue in ACTIVATIONS:
                    value = self.activate(value)
                b.store(value, slot)


def _intrinsic(module: ir.Module, fnty: ir.FunctionType, name: str) -> ir.Function:
    """``name`` declared in ``module`` once (a module may hold several kernels)."""
    try:
        found = module.get_global(name)
        assert isinstance(found, ir.Function)
        return found
    except KeyError:
        return ir.Function(module, fnty, name)


def _i64(value: int) -> ir.Constant:
    return ir.Constant(I64, value)


def build_module(epilogue: str = "none", packed: bool = True, blocked: bool = False) -> ir.Module:
    """The LLVM module of one variant: the packed, unpacked-B (``packed=False``) or channel-blocked
    micro-kernel with ``epilogue``. One module each, built and compiled only when a program uses it
    (the AVX2 passes made each ~1.5 s of cold compile), and compiled in parallel with the kernels
    (``support_modules``)."""
    module = ir.Module(name=f"onnxsat_{support_name(epilogue, packed, blocked)}")
    _Gen(module, epilogue, packed, blocked).build()
    return module


def support_name(epilogue: str, packed: bool = True, blocked: bool = False) -> str:
    """The support-code name (``jit.support_code``) of one variant."""
    return f"gemm_blocked_{epilogue}" if blocked else f"gemm_{epilogue}" if packed else f"gemm_rows_{epilogue}"


def support_modules(variants: set[tuple[str, bool, bool]]) -> dict[str, Callable[[], ir.Module]]:
    """Support name -> builder of each (epilogue, packed, blocked) variant."""
    return {support_name(*v): functools.partial(build_module, *v) for v in sorted(variants)}


@functools.cache
def _compiled(epilogue: str, cache_dir: Path | None, packed: bool, blocked: bool) -> LoadedObjects:
    """One variant, loaded once per process and cache directory (the object cached on disk under
    the sources' fingerprint)."""
    return support_code(support_name(epilogue, packed, blocked), functools.partial(build_module, epilogue, packed, blocked), cache_dir)


def sgemm_address(epilogue: str = "none", cache_dir: Path | None = None, packed: bool = True, blocked: bool = False) -> tuple[LoadedObjects, int]:
    """The compiled micro-kernel with ``epilogue`` (see ``EPILOGUES``) and its address; compiled
    through the object cache in ``cache_dir`` (None: no disk cache). ``packed=False``: the
    unpacked-B form (``ROW_EPILOGUES``); ``blocked``: the packed form storing C channel-blocked
    (``BLOCKED_EPILOGUES``)."""
    compiled = _compiled(epilogue, cache_dir, packed, blocked)
    return compiled, compiled.address((BLOCKED_EPILOGUES if blocked else EPILOGUES if packed else ROW_EPILOGUES)[epilogue])


def sgemm_function(epilogue: str = "none", cache_dir: Path | None = None, packed: bool = True, blocked: bool = False):  # type: ignore[no-untyped-def]
    """ctypes callable taking ``ARGS`` (``ROWS_ARGS`` for ``packed=False``, ``BLOCKED_ARGS`` for ``blocked``)."""
    import ctypes

    _, address = sgemm_address(epilogue, cache_dir, packed, blocked)
    names = BLOCKED_ARGS if blocked else ARGS if packed else ROWS_ARGS
    proto = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p if name in POINTER_ARGS else ctypes.c_int64 for name in names])
    return proto(address)
