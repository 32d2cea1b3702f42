"""com.microsoft attention and rotary forms against the opset-23 ones on onnxruntime's CPU provider.

Two parts. ``--forms``: one attention block from the 3-D projections to the 3-D output in each
form onnxruntime can run (opset-23 Attention over [B, H, T, D] with the exporters' head split and
merge, the same with k and v repeated to q's heads, opset-23 Attention on 3-D inputs,
MultiHeadAttention, GroupQueryAttention), and RotaryEmbedding (opset 23 against com.microsoft), at
BERT-base, Whisper-tiny, GPT-2 and Llama-style sizes. ``--corpus DIR``: full-size exports
optimized by onnxsat (default; ``--allow-contrib-ops``; ``--allow-contrib-ops --keep-opset``, where
attention is written as MultiHeadAttention) and by onnxruntime's transformer optimizer (the anchor,
run with ``--peers-python``, a Python with torch): nodes, fused ops, max error against the
original on the corpus feeds (also with left padding) and ORT_ENABLE_ALL latency ratios.

Latency: two threads, interleaved rounds, bootstrap 95% intervals; ratios only, with the load
average (the machine may be shared).

    python benchmarks/contrib_attention.py --forms
    python benchmarks/contrib_attention.py --corpus /work/realmodels-full --peers-python PY \\
        [--models bert-ts-static ...] [--rounds 20] [--out benchmarks/results/contrib_attention.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
from compare_peers import measure_latency, run_tool
from onnx import TensorProto, helper

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.realmodels_feeds import feeds_for  # noqa: E402

TOOLS = ("onnxsat", "onnxsat-contrib", "onnxsat-contrib-keep-opset", "ort-transformers")
FUSED = ("Attention", "MultiHeadAttention", "GroupQueryAttention", "RotaryEmbedding", "Softmax")
DEFAULT_MODELS = [
    "bert-ts-static",
    "distilbert-ts-static",
    "gpt2-ts-static",
    "t5_encoder-ts-static",
    "whisper_tiny_encoder-dynamo-static",
    "llama-ts-static",
    "mistral-ts-static",
    "qwen2-decode-ts-static",
]
F = TensorProto.FLOAT


# ---------------------------------------------------------------- one block in each form
def _vi(name: str, shape: list[int]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, F, shape)


def _ints(name: str, values: list[int]) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=helper.make_tensor(name, TensorProto.INT64, [len(values)], values))


def _heads_split(nodes: list[onnx.NodeProto], b: int, t: int, s: int, h: int, hkv: int, d: int) -> None:
    nodes += [_ints("sq", [b, t, h, d]), _ints("skv", [b, s, hkv, d]), _ints("so", [b, t, h * d])]
    for name, shape in (("q", "sq"), ("k", "skv"), ("v", "skv")):
        nodes.append(helper.make_node("Reshape", [name, shape], [name + "r"]))
        nodes.append(helper.make_node("Transpose", [name + "r"], [name + "4"], perm=[0, 2, 1, 3]))


def block(form: str, b: int, t: int, s: int, h: int, hkv: int, d: int, causal: bool) -> onnx.ModelProto:
    """q [b, t, h*d], k and v [b, s, hkv*d], a float mask [1, 1, t, s] -> out [b, t, h*d] in ``form``."""
    inputs = [_vi("q", [b, t, h * d]), _vi("k", [b, s, hkv * d]), _vi("v", [b, s, hkv * d]), _vi("mask", [1, 1, t, s])]
    scale = float(d**-0.5)
    nodes: list[onnx.NodeProto] = []
    if form in ("std-4d", "std-4d-kv-heads"):
        _heads_split(nodes, b, t, s, h, hkv, d)
        k, v = "k4", "v4"
        if form == "std-4d" and hkv != h:  # repeat_kv, as the exporters write it
            nodes += [_ints("ax", [2]), _ints("e5", [b, hkv, h // hkv, s, d]), _ints("r4", [b, h, s, d])]
            for x in ("k4", "v4"):
                nodes += [
                    helper.make_node("Unsqueeze", [x, "ax"], [x + "u"]),
                    helper.make_node("Expand", [x + "u", "e5"], [x + "e"]),
                    helper.make_node("Reshape", [x + "e", "r4"], [x + "x"]),
                ]
            k, v = "k4x", "v4x"
        nodes.append(helper.make_node("Attention", ["q4", k, v, "mask"], ["o4"], scale=scale, is_causal=int(causal)))
        nodes.append(helper.make_node("Transpose", ["o4"], ["ot"], perm=[0, 2, 1, 3]))
        nodes.append(helper.make_node("Reshape", ["ot", "so"], ["out"]))
    elif form == "std-3d":
        attrs = {"q_num_heads": h, "kv_num_heads": hkv, "is_causal": int(causal)}
        nodes.append(helper.make_node("Attention", ["q", "k", "v", "mask"], ["out"], scale=scale, **attrs))
    elif form == "mha":
        attrs = {"num_heads": h, "unidirectional": int(causal)}
        nodes.append(helper.make_node("MultiHeadAttention", ["q", "k", "v", "", "", "mask"], ["out"], domain="com.microsoft", scale=scale, **attrs))
    elif form == "gqa":
        nodes.append(helper.make_node("Constant", [], ["lens"], value=helper.make_tensor("lens", TensorProto.INT32, [b], [s - 1] * b)))
        nodes.append(helper.make_node("Constant", [], ["total"], value=helper.make_tensor("total", TensorProto.INT32, [], [s])))
        ins = ["q", "k", "v", "", "", "lens", "total", "", "", "", "mask"]
        attrs = {"num_heads": h, "kv_num_heads": hkv, "causal": int(causal)}
        nodes.append(helper.make_node("GroupQueryAttention", ins, ["out"], domain="com.microsoft", scale=scale, **attrs))
    graph = helper.make_graph(nodes, form, inputs, [_vi("out", [b, t, h * d])])
    imports = [helper.make_opsetid("", 23), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=imports, ir_version=10)


def decode_block(form: str, b: int, p: int, h: int, hkv: int, d: int) -> onnx.ModelProto:
    """A decode step: q, k, v [b, 1, *] of one new token, past k and v [b, hkv, p, d] -> out
    [b, 1, h*d] and the present k and v [b, hkv, p + 1, d]; the mask is none (every key is seen)."""
    inputs = [_vi("q", [b, 1, h * d]), _vi("k", [b, 1, hkv * d]), _vi("v", [b, 1, hkv * d])]
    inputs += [_vi("pk", [b, hkv, p, d]), _vi("pv", [b, hkv, p, d])]
    outputs = [_vi("out", [b, 1, h * d]), _vi("present_k", [b, hkv, p + 1, d]), _vi("present_v", [b, hkv, p + 1, d])]
    scale = float(d**-0.5)
    nodes: list[onnx.NodeProto] = []
    if form == "gqa":
        nodes.append(helper.make_node("Constant", [], ["lens"], value=helper.make_tensor("lens", TensorProto.INT32, [b], [p] * b)))
        nodes.append(helper.make_node("Constant", [], ["total"], value=helper.make_tensor("total", TensorProto.INT32, [], [p + 1])))
        attrs = {"num_heads": h, "kv_num_heads": hkv, "scale": scale}
        ins = ["q", "k", "v", "pk", "pv", "lens", "total"]
        nodes.append(helper.make_node("GroupQueryAttention", ins, ["out", "present_k", "present_v"], domain="com.microsoft", **attrs))
    else:
        _heads_split(nodes, b, 1, 1, h, hkv, d)
        nodes.append(helper.make_node("Concat", ["pk", "k4"], ["present_k"], axis=2))
        nodes.append(helper.make_node("Concat", ["pv", "v4"], ["present_v"], axis=2))
        k, v = "present_k", "present_v"
        if form == "std-4d":
            nodes += [_ints("ax", [2]), _ints("e5", [b, hkv, h // hkv, p + 1, d]), _ints("r4", [b, h, p + 1, d])]
            for x in (k, v):
                nodes += [
                    helper.make_node("Unsqueeze", [x, "ax"], [x + "u"]),
                    helper.make_node("Expand", [x + "u", "e5"], [x + "e"]),
                    helper.make_node("Reshape", [x + "e", "r4"], [x + "x"]),
                ]
            k, v = k + "x", v + "x"
        nodes.append(helper.make_node("Attention", ["q4", k, v], ["o4"], scale=scale))
        nodes.append(helper.make_node("Transpose", ["o4"], ["ot"], perm=[0, 2, 1, 3]))
        nodes.append(helper.make_node("Reshape", ["ot", "so"], ["out"]))
    graph = helper.make_graph(nodes, form, inputs, outputs)
    imports = [helper.make_opsetid("", 23), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=imports, ir_version=10)


def rotary(form: str, h: int, t: int, d: int) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    cos, sin = (rng.standard_normal((t, d // 2)).astype(np.float32) for _ in range(2))
    if form == "std":
        inits = [onnx.numpy_helper.from_array(cos[None], "cos"), onnx.numpy_helper.from_array(sin[None], "sin")]
        node = helper.make_node("RotaryEmbedding", ["x", "cos", "sin"], ["y"])
    else:
        inits = [onnx.numpy_helper.from_array(a, n) for a, n in ((cos, "cos"), (sin, "sin"), (np.array([0], np.int64), "pos"))]
        node = helper.make_node("RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"], domain="com.microsoft")
    graph = helper.make_graph([node], form, [_vi("x", [1, h, t, d])], [_vi("y", [1, h, t, d])], inits)
    imports = [helper.make_opsetid("", 23), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=imports, ir_version=10)


FORM_CASES = [
    ("BERT-base layer", (1, 128, 128, 12, 12, 64), False, ["std-4d", "std-3d", "mha"]),
    ("8-head layer", (1, 128, 128, 8, 8, 64), False, ["std-4d", "std-3d", "mha"]),
    ("Whisper-tiny layer", (1, 1500, 1500, 6, 6, 64), False, ["std-4d", "std-3d", "mha"]),
    ("GPT-2 layer, causal", (1, 128, 128, 12, 12, 64), True, ["std-4d", "std-3d", "mha", "gqa"]),
    ("Llama-style 8 q / 2 kv heads, causal", (1, 128, 128, 8, 2, 64), True, ["std-4d", "std-4d-kv-heads", "std-3d", "gqa"]),
    ("decode step, 8 q / 2 kv heads, 129 keys", (1, 1, 129, 8, 2, 64), False, ["std-4d", "std-4d-kv-heads", "gqa"]),
]


def forms(rounds: int) -> None:
    print(f"load average {os.getloadavg()}")
    rng = np.random.default_rng(0)
    for label, (b, t, s, h, hkv, d), causal, names in FORM_CASES:
        feeds = {
            "q": rng.standard_normal((b, t, h * d)).astype(np.float32),
            "k": rng.standard_normal((b, s, hkv * d)).astype(np.float32),
            "v": rng.standard_normal((b, s, hkv * d)).astype(np.float32),
            "mask": np.where(rng.random((1, 1, t, s)) < 0.9, 0.0, -1e4).astype(np.float32),
        }
        if t == 1:  # a decode step: past k and v of s - 1 rows, one new token
            feeds["k"], feeds["v"] = feeds["k"][:, :1], feeds["v"][:, :1]
            del feeds["mask"]
            for name in ("pk", "pv"):
                feeds[name] = rng.standard_normal((b, hkv, s - 1, d)).astype(np.float32)
            models = {n: decode_block(n, b, s - 1, h, hkv, d) for n in names}
        else:
            models = {n: block(n, b, t, s, h, hkv, d, causal) for n in names}
        _report(label, models, feeds, rounds)
    for h, t, d in ((8, 128, 64), (32, 128, 128)):
        x = {"x": rng.standard_normal((1, h, t, d)).astype(np.float32)}
        _report(f"rotary [1, {h}, {t}, {d}]", {n: rotary(n, h, t, d) for n in ("std", "contrib")}, x, rounds)
    print(f"load average {os.getloadavg()}")


def _report(label: str, models: dict[str, onnx.ModelProto], feeds: dict[str, np.ndarray], rounds: int) -> None:
    from onnxsat.latency import ort_session

    names = list(models)
    refs = ort_session(models[names[0]], level="all", threads=2).run(None, feeds)
    for name in names[1:]:
        gots = ort_session(models[name], level="all", threads=2).run(None, feeds)
        for got, ref in zip(gots, refs, strict=True):
            assert float(np.max(np.abs(got - ref))) <= 1e-4 * float(np.max(np.abs(ref))) + 1e-6, (label, name)
    base_ms, ratios = measure_latency(models, feeds, "all", rounds, threads=2)
    cells = [f"{n} x{r['ratio']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}]" for n, r in ratios.items()]
    print(f"| {label} | {names[0]} {base_ms:.3f} ms | " + " | ".join(cells) + " |", flush=True)


# ---------------------------------------------------------------- full-size exports
def _fused(model: onnx.ModelProto) -> dict[str, int]:
    ops = Counter(n.op_type for n in model.graph.node)
    return {op: ops[op] for op in FUSED if ops[op]}


def _max_error(original: onnx.ModelProto, optimized: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> float:
    """max |a - b| over outputs, in units of the issue's bound 1e-4 * max|ref| + 1e-6 (<= 1 passes)."""
    from onnxsat.latency import ort_session

    ref = ort_session(original, level="disable", threads=2).run(None, feeds)
    got = ort_session(optimized, level="all", threads=2).run(None, feeds)
    worst = 0.0
    for a, b in zip(ref, got, strict=True):
        bound = 1e-4 * float(np.max(np.abs(a))) + 1e-6
        worst = max(worst, float(np.max(np.abs(a.astype(np.float64) - b))) / bound)
    return worst


def corpus(corpus_dir: Path, models: list[str], peers_python: str | None, rounds: int, out: Path) -> None:
    index = json.loads((corpus_dir / "INDEX.json").read_text())
    results = json.loads(out.read_text()) if out.exists() else {}
    for name in models:
        record = index[name]
        src = corpus_dir / record["file"]
        original = onnx.load(src)
        row: dict = {"nodes": len(original.graph.node), "tools": {}, "load_before": os.getloadavg()[0]}
        with tempfile.TemporaryDirectory() as tmp:
            optimized = {"original": original}
            for tool in TOOLS:
                result, path = run_tool(tool, src, Path(tmp), timeout=1800, peers_python=peers_python)
                entry: dict = {"status": result.status, "seconds": result.seconds}
                if path is not None:
                    model = onnx.load(path)
                    feeds = feeds_for(record["inputs"], seed=0)
                    padded = {n: a.copy() for n, a in feeds.items()}
                    if "attention_mask" in padded and padded["attention_mask"].shape[-1] > 3:
                        padded["attention_mask"][...] = 1
                        padded["attention_mask"][:, :3] = 0  # left padding: fully masked query rows
                    entry.update(nodes=len(model.graph.node), fused=_fused(model))
                    entry["error_over_bound"] = max(_max_error(original, model, f) for f in (feeds, padded))
                    optimized[tool] = model
                row["tools"][tool] = entry
                print(f"{name} {tool}: {entry}", flush=True)
            feeds = feeds_for(record["inputs"], seed=0)
            base_ms, ratios = measure_latency(optimized, feeds, "all", rounds, threads=2)
            row["original_ms"] = base_ms
            for tool, ratio in ratios.items():
                row["tools"][tool]["vs_original"] = ratio
            if "ort-transformers" in optimized:
                anchor = {k: v for k, v in optimized.items() if k != "original"}
                anchor = {"ort-transformers": anchor.pop("ort-transformers"), **anchor}
                _, vs_anchor = measure_latency(anchor, feeds, "all", rounds, threads=2)
                for tool, ratio in vs_anchor.items():
                    row["tools"][tool]["vs_ort_transformers"] = ratio
        row["load_after"] = os.getloadavg()[0]
        results[name] = row
        out.write_text(json.dumps(results, indent=1))
        print(f"{name}: original {base_ms:.2f} ms; " + "; ".join(
            f"{t} x{e.get('vs_original', {}).get('ratio', float('nan')):.3f}" for t, e in row["tools"].items()
        ), flush=True)  # fmt: skip


def render(results: dict) -> str:
    """The corpus rows as a markdown table: nodes and fused ops, error, ratios with intervals."""

    def ratio(entry: dict, key: str) -> str:
        r = entry.get(key)
        return "-" if not r else f"x{r['ratio']:.3f} [{r['ci_low']:.2f}, {r['ci_high']:.2f}]"

    lines = [
        "| model | tool | nodes | fused | error / bound | original / tool | transformer optimizer / tool |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, row in results.items():
        lines.append(f"| {name} (load {row['load_before']:.1f}-{row['load_after']:.1f}) | original | {row['nodes']} | | | {row['original_ms']:.1f} ms | |")
        for tool, e in row["tools"].items():
            if e["status"] != "ok":
                lines.append(f"| | {tool} | {e['status']} | | | | |")
                continue
            fused = ", ".join(f"{op} {n}" for op, n in e["fused"].items())
            lines.append(f"| | {tool} | {e['nodes']} | {fused} | {e['error_over_bound']:.3f} | {ratio(e, 'vs_original')} | {ratio(e, 'vs_ort_transformers')} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--forms", action="store_true")
    parser.add_argument("--corpus", type=Path)
    parser.add_argument("--models", nargs="*", default=DEFAULT_MODELS)
    parser.add_argument("--peers-python")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "contrib_attention.json")
    parser.add_argument("--render", action="store_true", help="print the corpus results of --out as a table")
    args = parser.parse_args()
    if args.render:
        print(render(json.loads(args.out.read_text())))
    if args.forms:
        forms(args.rounds)
    if args.corpus is not None:
        corpus(args.corpus, args.models, args.peers_python, args.rounds, args.out)


if __name__ == "__main__":
    main()
