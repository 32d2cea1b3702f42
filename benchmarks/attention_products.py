"""BERT's attention products per head (QK^T and PV, 12 heads, head size 64) on one thread:
OpenBLAS on the strided views the compiled model passes it, against the packed micro-kernel with B
already packed (``pack_b``) and, separately, the cost of packing B with numpy. The kernel-only
ratio is an upper bound on what routing these products through the packed GEMM (B packed at run
time) could gain; a native pack would cost less than numpy's but not nothing.

    python benchmarks/attention_products.py --seq 128 512 --rounds 40
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from onnxsat.kernels.blas import gemm_function, single_threaded_blas
from onnxsat.kernels.gemm import pack_b, sgemm_function
from onnxsat.latency import compare_latency

HEADS, HEAD = 12, 64
HIDDEN = HEADS * HEAD
ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112


def products(seq: int) -> dict[str, tuple[np.ndarray, int, np.ndarray, int, int, int, int, int]]:
    """Per product: A (heads side by side, row stride lda), B as BLAS sees it (ldb, transpose flag),
    and m, n, k. Q, K, V are (seq, 768) with head h in columns 64h..64h+63; P is (12, seq, seq)."""
    rng = np.random.default_rng(seq)
    q, kk, v = (rng.standard_normal((seq, HIDDEN)).astype(np.float32) for _ in range(3))
    p = rng.random((HEADS, seq, seq)).astype(np.float32)
    return {"QK^T": (q, HIDDEN, kk, HIDDEN, TRANS, seq, seq, HEAD), "PV": (p, seq, v, HIDDEN, NO_TRANS, seq, HEAD, seq)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    single_threaded_blas()
    blas = gemm_function("f32")
    assert blas is not None
    packed_fn = sgemm_function()
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    for seq in args.seq:
        for name, (a, lda, b, ldb, tb, m, n, k) in products(seq).items():
            c_blas = np.empty((HEADS, m, n), np.float32)
            c_packed = np.empty((HEADS, m, n), np.float32)
            head_a = [a.ctypes.data + 4 * (h * HEAD if name == "QK^T" else h * seq * seq) for h in range(HEADS)]
            head_b = [b.ctypes.data + 4 * h * HEAD for h in range(HEADS)]
            b_mats = [(b[:, h * HEAD : (h + 1) * HEAD].T if tb == TRANS else b[:, h * HEAD : (h + 1) * HEAD]) for h in range(HEADS)]
            t0 = time.perf_counter()
            packs = [pack_b(np.ascontiguousarray(bm)) for bm in b_mats]
            pack_ms = (time.perf_counter() - t0) * 1e3

            def run_blas() -> None:
                for h in range(HEADS):
                    blas(ROW_MAJOR, NO_TRANS, tb, m, n, k, 1.0, head_a[h], lda, head_b[h], ldb, 0.0, c_blas[h].ctypes.data, n)  # noqa: B023

            def run_packed() -> None:
                for h in range(HEADS):
                    packed_fn(head_a[h], lda, packs[h].ctypes.data, k, c_packed[h].ctypes.data, n, m, n, 0, packs[h].shape[0])  # noqa: B023

            run_blas()
            run_packed()
            np.testing.assert_allclose(c_packed, c_blas, rtol=1e-4, atol=1e-3)
            result = compare_latency(run_blas, run_packed, rounds=args.rounds)
            print(f"seq {seq} {name} x12 heads, one thread: OpenBLAS -> packed (B prepacked) {result}; numpy pack of B {pack_ms:.3f} ms (load {os.getloadavg()[0]:.2f})")


if __name__ == "__main__":
    main()
