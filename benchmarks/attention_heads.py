"""Attention scheduled over all heads at once against head by head, on today's lowering.

BERT-base attention (12 heads of 64) at sequence S: QK^T, scale + mask + softmax, PV. Lowered as
exported, each stage covers all heads before the next starts, so the 12 x S x S scores (12 MiB at
S = 512) leave the caches between stages. The per-head form writes the same computation as one
subgraph per head (Split, then MatMul, Mul, Add, Softmax, MatMul per head, Concat), which the
lowering emits head by head: one head's scores (1 MiB at S = 512) stay in L2 from the product
that writes them to the one that reads them. Both compiled models are checked equal, then timed
with ``onnxsat.latency.compare_latency`` (ratio = batched / per head; above 1: per head faster).
A diagnosis for scheduling attention per head in the lowering, not a model-level claim.

    python benchmarks/attention_heads.py [--seq 128 512] [--threads 1 2] [--rounds 30]
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HEADS, DIM = 12, 64


def _vi(name: str, shape: list[int] | None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def models(seq: int) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """(all heads per stage, one subgraph per head) for sequence length ``seq``."""
    mk = helper.make_node
    inits = [numpy_helper.from_array(np.array(1.0 / np.sqrt(DIM), np.float32), "scale")]
    ins = [_vi("q", [1, HEADS, seq, DIM]), _vi("kt", [1, HEADS, DIM, seq]), _vi("v", [1, HEADS, seq, DIM]), _vi("mask", [1, 1, 1, seq])]
    stages = [
        mk("MatMul", ["q", "kt"], ["s"]), mk("Mul", ["s", "scale"], ["s1"]), mk("Add", ["s1", "mask"], ["s2"]),
        mk("Softmax", ["s2"], ["p"], axis=-1), mk("MatMul", ["p", "v"], ["y"]),
    ]
    nodes = [mk("Split", [t], [f"{t}{h}" for h in range(HEADS)], axis=1, num_outputs=HEADS) for t in ("q", "kt", "v")]
    for h in range(HEADS):
        nodes += [
            mk("MatMul", [f"q{h}", f"kt{h}"], [f"s{h}"]), mk("Mul", [f"s{h}", "scale"], [f"a{h}"]),
            mk("Add", [f"a{h}", "mask"], [f"b{h}"]), mk("Softmax", [f"b{h}"], [f"p{h}"], axis=-1),
            mk("MatMul", [f"p{h}", f"v{h}"], [f"y{h}"]),
        ]
    nodes.append(mk("Concat", [f"y{h}" for h in range(HEADS)], ["y"], axis=1))
    opset = [helper.make_opsetid("", 18)]
    return (
        helper.make_model(helper.make_graph(stages, "batched", ins, [_vi("y", None)], inits), opset_imports=opset),
        helper.make_model(helper.make_graph(nodes, "per_head", ins, [_vi("y", None)], inits), opset_imports=opset),
    )


def main(argv: list[str] | None = None) -> int:
    from onnxsat.kernels.compile_options import CompileOptions
    from onnxsat.kernels.compiled import CompiledModel
    from onnxsat.latency import compare_latency

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq", type=int, nargs="*", default=[128, 512])
    parser.add_argument("--threads", type=int, nargs="*", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args(argv)
    print(f"{args.rounds} interleaved rounds; ratio = batched / per head (above 1: per head faster)\n")
    print("| seq | threads | batched ms | per head ms | ratio [95% CI] | arena MiB (batched, per head) | load |")
    print("|---|---|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    for seq in args.seq:
        feeds = {
            "q": rng.standard_normal((1, HEADS, seq, DIM)).astype(np.float32),
            "kt": rng.standard_normal((1, HEADS, DIM, seq)).astype(np.float32),
            "v": rng.standard_normal((1, HEADS, seq, DIM)).astype(np.float32),
            "mask": np.where(rng.random((1, 1, 1, seq)) < 0.1, -1e4, 0.0).astype(np.float32),
        }
        for threads in args.threads:
            batched, per_head = (CompiledModel(m, CompileOptions(threads=threads)) for m in models(seq))
            if not np.array_equal(batched(feeds)["y"], per_head(feeds)["y"]):
                raise SystemExit(f"seq {seq}: the two schedules differ")
            arenas = [c.executable_for(feeds).plan.size / 2**20 for c in (batched, per_head)]
            result = compare_latency(lambda: batched(feeds), lambda: per_head(feeds), rounds=args.rounds)  # noqa: B023
            print(f"| {seq} | {threads} | {result.baseline_ms:.2f} | {result.candidate_ms:.2f} | {result.ratio:.3f} "
                  f"[{result.ci_low:.3f}, {result.ci_high:.3f}] | {arenas[0]:.1f}, {arenas[1]:.1f} | {os.getloadavg()[0]:.1f} |", flush=True)
            batched.close()
            per_head.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
