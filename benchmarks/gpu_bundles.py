"""Build the CUDA bundles a GPU session checks and times (the CPU side of the GPU check).

A GPU machine may lack egglog, so everything that needs onnxsat happens here: each suite entry is
lowered, planned and written as an ``--emit-ptx`` bundle (``kernels/cuda/bundle.py``); on the GPU,
``benchmarks/gpu_suite.sh DIR OUT`` runs ``benchmarks/gpu_check.py`` on every bundle.

* ``examples``: every runnable example, optimized as ``onnxsat compile`` does, with check data
  (each launch and the whole model compared with the CPU backend on the GPU);
* ``kernels``: fused elementwise chains at 16M and 64M floats and square GEMMs (timing only:
  bandwidth against the device copy, GEMM against cuBLAS), and Softmax/LayerNorm rows (checked);
* ``models``: the MLP and BERT layers of compiled_vs_ort.py (whole-model time, no check data:
  their weights would not fit the transfer);
* ``partial``: for every PET partial family, its benchmark site as the original, as the
  composite extraction would emit (mutant + correction), and as optimized with the partial
  family under the h200 cost model (``-h200``: what extraction chooses for a GPU), all with
  check data, so gpu_check's ``--compare`` times the others against the original on the GPU.

    python benchmarks/gpu_bundles.py OUT [--only examples,partial]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

EXAMPLES = ["small_cnn", "transformer_block", "inception_block", "layout_algebra", "decoder_block", "spp_block"]


def _graph(nodes: list[onnx.NodeProto], inputs: dict[str, list[int]], out: str) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "kernel",
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, v) for k, v in inputs.items()],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def relu_fma(n: int) -> onnx.ModelProto:
    nodes = [helper.make_node("Mul", ["a", "b"], ["m"]), helper.make_node("Add", ["m", "c"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    return _graph(nodes, {"a": [n], "b": [n], "c": [n]}, "y")


def silu_scale(n: int) -> onnx.ModelProto:
    nodes = [
        helper.make_node("Sigmoid", ["a"], ["g"]),
        helper.make_node("Mul", ["a", "g"], ["m"]),
        helper.make_node("Mul", ["m", "s"], ["y"]),
    ]
    return _graph(nodes, {"a": [n], "s": [1]}, "y")


def row_kernels(rows: int, width: int) -> onnx.ModelProto:
    """A masked, scaled Softmax and a residual LayerNormalization over rows of ``width``."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(width).astype(np.float32), n) for n in ("gamma", "beta")]
    nodes = [
        helper.make_node("Mul", ["x", "scale"], ["xs"]),
        helper.make_node("Add", ["xs", "mask"], ["xm"]),
        helper.make_node("Softmax", ["xm"], ["probs"], axis=-1),
        helper.make_node("Add", ["x", "r"], ["xr"]),
        helper.make_node("LayerNormalization", ["xr", "gamma", "beta"], ["normed"], axis=-1, epsilon=1e-5),
    ]
    graph = helper.make_graph(
        nodes,
        "rows",
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, v) for k, v in {"x": [rows, width], "r": [rows, width], "mask": [1, width]}.items()],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, [rows, width]) for o in ("probs", "normed")],
        [*inits, numpy_helper.from_array(np.array(0.125, np.float32), "scale")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def matmul(size: int) -> onnx.ModelProto:
    return _graph([helper.make_node("MatMul", ["a", "b"], ["y"])], {"a": [size, size], "b": [size, size]}, "y")


def partial_pair(rule: str) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """The rule's benchmark site and the composite (mutant + correction) written as ONNX."""
    from onnxsat.egraph.importer import from_onnx
    from onnxsat.extract.serialized import serialize
    from onnxsat.rules.pet.partial import find_sites
    from onnxsat.rules.pet.partial_models import MODELS
    from onnxsat.rules.pet.verify_partial import composite_model

    model = MODELS[rule]["bench"]()
    program = from_onnx(model)
    eg = serialize(program.egraph)
    site = find_sites([rule], eg)[0]
    leaves = {n: program.names[eg.origins[c]] for n, (c, _, _) in site.leaves.items()}
    return model, composite_model(site, model, leaves)


Entry = tuple[Callable[[], onnx.ModelProto], bool, str]


def suite(groups: set[str]) -> dict[str, Entry]:
    """name -> (model builder, optimize first, check data: ``steps``, ``model`` or ``none``)."""
    from compiled_vs_ort import bert_layer, mlp

    from onnxsat.rules.pet.partial_models import MODELS

    out: dict[str, Entry] = {}
    if "examples" in groups:
        for name in EXAMPLES:
            out[name] = (lambda name=name: onnx.load(str(ROOT / "examples" / f"{name}.onnx")), True, "steps")
    if "kernels" in groups:
        for n in (16 << 20, 64 << 20):
            out[f"relu_fma_{n >> 20}M"] = (lambda n=n: relu_fma(n), False, "none")
            out[f"silu_scale_{n >> 20}M"] = (lambda n=n: silu_scale(n), False, "none")
        for size in (1024, 4096):
            out[f"matmul_{size}"] = (lambda size=size: matmul(size), False, "none")
        out["row_kernels"] = (lambda: row_kernels(512, 768), False, "steps")
    if "models" in groups:
        out["mlp"] = (mlp, False, "none")
        out["bert128"] = (lambda: bert_layer(128), False, "none")
        out["bert512"] = (lambda: bert_layer(512), False, "none")
    if "partial" in groups:
        for rule in MODELS:
            pair: dict[str, onnx.ModelProto] = {}

            def side(i: int, rule: str = rule, pair: dict[str, onnx.ModelProto] = pair) -> onnx.ModelProto:
                if rule not in pair:
                    pair["original"], pair["composite"] = partial_pair(rule)
                return pair["original" if i == 0 else "composite"]

            out[f"partial-{rule}-original"] = (lambda side=side: side(0), False, "model")
            out[f"partial-{rule}-composite"] = (lambda side=side: side(1), False, "model")
            out[f"partial-{rule}-h200"] = (lambda side=side: side(0), True, "model")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--only", default="examples,kernels,models,partial", help="comma-separated groups")
    ap.add_argument("--arch", default="sm_90")
    args = ap.parse_args(argv)

    from onnxsat.base.options import Options
    from onnxsat.compile_cuda_command import emit_bundle
    from onnxsat.pipeline import optimize
    from onnxsat.verification import make_inputs

    summary = {}
    for name, (build, optimize_first, check) in suite(set(args.only.split(","))).items():
        start = time.perf_counter()
        model = build()
        feeds = make_inputs(model, seed=0)
        extra = {}
        if optimize_first:
            gpu = name.endswith("-h200")
            options = Options(target="h200", enable_rules=("partial",)) if gpu else Options()
            model, report = optimize(model, options)
            if gpu:
                extra["partial_used"] = [p["rule"] for p in report.partial if p["used"]]
        try:
            _, _, manifest = emit_bundle(model, feeds, args.out / name, args.arch, name, check != "none", check == "steps")
        except Exception as exc:  # noqa: BLE001 - one entry failing must not lose the others
            print(f"{name}: FAILED {type(exc).__name__}: {exc}")
            summary[name] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        hosts = sum(s["kind"] == "host" for s in manifest["steps"])
        summary[name] = {"launches": len(manifest["steps"]) - hosts, "host_steps": hosts, "check": check, **extra}
        print(f"{name}: {summary[name]['launches']} launches, {hosts} host steps, {time.perf_counter() - start:.1f} s {extra}", flush=True)
    (args.out / "suite.json").write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
