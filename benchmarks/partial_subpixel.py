"""ConvTranspose as a sub-pixel convolution (exact site rule ``conv-transpose-subpixel``, on by default) on onnxruntime.

For a decoder (examples/decoder_block.onnx by default: two kernel-4 stride-2 ConvTranspose + Relu
upsamplings and a 3x3 Conv), ``onnxsat.optimize`` with the default options (the rule on: each site
PET-verified at its shapes, added, and chosen or not by the built-in ort-cpu cost model) against the
original and against onnxsat with the rule disabled: which sites extraction used, verification, max abs error on
onnxruntime, and median latency ratios with a bootstrap 95% CI (ORT_ENABLE_ALL on both sides,
interleaved rounds; a win needs the whole interval above 1.02). Then single ConvTranspose layers of
common decoder shapes, original against the sub-pixel form the rule writes (the site's composite).

    python benchmarks/partial_subpixel.py --out benchmarks/results/partial_subpixel.md [--rounds 40]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

import onnxsat
from onnxsat.egraph.importer import from_onnx
from onnxsat.extract.serialized import serialize
from onnxsat.latency import compare_models, ort_session
from onnxsat.rules.pet.partial import find_sites
from onnxsat.rules.pet.partial_models import site_model
from onnxsat.rules.pet.partial_subpixel import RULE
from onnxsat.rules.pet.verify_partial import composite_model, verify_site

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "decoder_block.onnx"

LAYERS = [  # (input shape, output channels, kernel, pads, output_padding)
    ((1, 64, 56, 56), 32, 4, 1, 0),
    ((1, 256, 14, 14), 128, 4, 1, 0),
    ((1, 32, 112, 112), 16, 4, 1, 0),
    ((1, 64, 56, 56), 32, 3, 1, 1),
    ((1, 128, 32, 32), 64, 3, 1, 1),
]


def _feeds(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
        for i in model.graph.input
    }


def run_example(path: Path, rounds: int) -> list[str]:
    model = onnx.load(str(path))
    with_rule, report = onnxsat.optimize(model, onnxsat.Options())
    without, _ = onnxsat.optimize(model, onnxsat.Options(disable_rules=(RULE,)))
    feeds = _feeds(model)
    outs = [ort_session(m).run(None, feeds) for m in (model, with_rule)]
    err = max(float(np.abs(a - b).max()) for a, b in zip(*outs, strict=True))
    vs_original = compare_models(model, with_rule, feeds, rounds=rounds)
    vs_plain = compare_models(without, with_rule, feeds, rounds=rounds)
    lines = [
        f"## Example: {path.name} (onnxsat optimize, default options: {RULE} on)",
        "",
        "| site (input, weight, bias) | status | PET check | used by extraction |",
        "|---|---|---|---|",
    ]
    for p in report.partial:
        lines.append(f"| {p['shapes']} | {p['status']} | {p['detail']} | {'yes' if p['used'] else 'no'} |")
    ops = [n.op_type for n in with_rule.graph.node]
    lines += [
        "",
        f"Optimized ops: {', '.join(ops)}. Verification: {report.verification.status}; max abs error vs the"
        f" original on onnxruntime: {err:.2e}. Estimated cost (us): {report.cost_before:.1f} -> {report.cost_after:.1f}.",
        "",
        "| comparison | baseline ms | with the rule ms | ratio | 95% CI | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for name, c in (("original vs optimized (default options)", vs_original), (f"optimized with `--disable-rules {RULE}` vs default", vs_plain)):
        lines.append(f"| {name} | {c.baseline_ms:.3f} | {c.candidate_ms:.3f} | {c.ratio:.3f} | [{c.ci_low:.3f}, {c.ci_high:.3f}] | {c.verdict} |")
    return lines


def layer_model(x_shape: tuple[int, ...], c_out: int, kernel: int, pad: int, extra: int) -> onnx.ModelProto:
    out = [(d - 1) * 2 - 2 * pad + kernel + extra for d in x_shape[2:]]
    node = helper.make_node(
        "ConvTranspose", ["x", "w", "b"], ["y"], kernel_shape=[kernel] * 2, strides=[2, 2], pads=[pad] * 4, output_padding=[extra] * 2
    )
    return site_model([node], {"x": list(x_shape)}, {"y": [x_shape[0], c_out, *out]}, {"w": (x_shape[1], c_out, kernel, kernel), "b": (c_out,)}, weight_scale=0.1)


def run_layers(rounds: int) -> list[str]:
    lines = [
        "## Single ConvTranspose layers (stride 2): original vs the rule's composite",
        "",
        "| input | C_out | kernel, pads, output_padding | PET: differing/boxes | est. cost (us) orig -> sub-pixel | chosen | original ms | sub-pixel ms | ratio | 95% CI | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for x_shape, c_out, kernel, pad, extra in LAYERS:
        model = layer_model(x_shape, c_out, kernel, pad, extra)
        program = from_onnx(model)
        eg = serialize(program.egraph)
        (site,) = find_sites([RULE], eg)
        verdict = verify_site(site)
        composite = composite_model(site, model, {n: program.names[eg.origins[c]] for n, (c, _, _) in site.leaves.items()})
        _, report = onnxsat.optimize(model, onnxsat.Options(rules_only=("core",), enable_rules=(RULE,), verify=False))
        used = any(p["used"] for p in report.partial)
        c = compare_models(model, composite, _feeds(model), rounds=rounds)
        lines.append(
            f"| {list(x_shape)} | {c_out} | {kernel}, {pad}, {extra} | {verdict.differing_boxes}/{verdict.boxes} |"
            f" {report.cost_before:.0f} -> {report.cost_after:.0f} | {'yes' if used else 'no'} | {c.baseline_ms:.3f} | {c.candidate_ms:.3f} |"
            f" {c.ratio:.3f} | [{c.ci_low:.3f}, {c.ci_high:.3f}] | {c.verdict} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--example", type=Path, default=EXAMPLE)
    parser.add_argument("--skip-layers", action="store_true")
    args = parser.parse_args()
    load_start = os.getloadavg()[0]
    lines = [
        "# ConvTranspose as sub-pixel convolution on onnxruntime (CPU)",
        "",
        f"{datetime.date.today()}, {platform.machine()}, {os.cpu_count()} cores, onnxruntime ORT_ENABLE_ALL, {args.rounds}"
        " interleaved rounds, threads default. Ratio = median(baseline) / median(candidate); 95% bootstrap CI;"
        " a win needs the CI above 1.02.",
        "",
        *run_example(args.example, args.rounds),
        "",
    ]
    if not args.skip_layers:
        lines += [*run_layers(args.rounds), ""]
    lines.append(f"Load average (1 min) at start {load_start:.2f}, at end {os.getloadavg()[0]:.2f} (a shared 2-core machine).")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
