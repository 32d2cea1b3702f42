"""A model whose weights exceed 2 GiB (external data) through ``onnxsat optimize``: time, memory, correctness.

Protobuf cannot hold one message of 2 GiB or more, so such models keep their weights in a sidecar
file. This script writes one, layer by layer (one weight in memory at a time): an MLP of
``--layers`` blocks MatMul -> Add -> Relu on a [batch, hidden] input with float32 weights of
hidden x hidden (9 x 8192^2 x 4 bytes = 2.25 GiB plus biases by default). It then runs the real
command line in a fresh process (``python -m onnxsat optimize ... --report-json``), reporting its
wall time and peak RSS (``os.wait4``), and checks the written model independently: onnxruntime
loads the original and the optimized file from their paths and compares outputs on a seeded input.

    python benchmarks/large_model.py                     # > 2 GiB in a temporary directory
    python benchmarks/large_model.py --hidden 1024 --layers 3 --workdir /tmp/big --keep

Needs 2x the weights in free disk (input and output); the optimizer keeps the weights in their
file and peaks a little above 1x the weights in RAM (see the printed peak RSS).
The exit status is 1 if the command fails or the outputs differ.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper

ALIGN = 4096


def build_large_model(path: Path, *, hidden: int, layers: int, seed: int = 0) -> int:
    """Write the MLP to ``path`` with its weights in ``path.name + '.data'``; returns the weight bytes.

    Weights are generated and written one at a time, so memory stays at one hidden x hidden array.
    """
    rng = np.random.default_rng(seed)
    sidecar = path.with_name(path.name + ".data")
    inits: list[TensorProto] = []
    nodes = []
    offset = 0
    with open(sidecar, "wb") as data:

        def add(name: str, array: np.ndarray) -> None:
            nonlocal offset
            pad = -offset % ALIGN
            data.write(b"\0" * pad)
            offset += pad
            raw = np.ascontiguousarray(array, dtype=np.float32).tobytes()
            data.write(raw)
            tensor = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=list(array.shape))
            tensor.data_location = TensorProto.EXTERNAL
            for key, value in (
                ("location", sidecar.name),
                ("offset", str(offset)),
                ("length", str(len(raw))),
            ):
                entry = tensor.external_data.add()
                entry.key, entry.value = key, value
            inits.append(tensor)
            offset += len(raw)

        current = "x"
        for i in range(layers):
            weight = rng.standard_normal((hidden, hidden), dtype=np.float32)
            weight *= np.float32(np.sqrt(2.0 / hidden))
            add(f"w{i}", weight)
            del weight
            add(f"b{i}", (0.05 * rng.standard_normal(hidden)).astype(np.float32))
            out = "y" if i == layers - 1 else f"h{i}"
            nodes += [
                helper.make_node("MatMul", [current, f"w{i}"], [f"m{i}"]),
                helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"]),
                helper.make_node("Relu", [f"a{i}"], [out]),
            ]
            current = out
    graph = helper.make_graph(
        nodes,
        "large_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", hidden])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", hidden])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.write_bytes(model.SerializeToString())
    return offset


def run_cli(src: Path, dst: Path, report: Path, extra: list[str]) -> tuple[int, float, float, str]:
    """``python -m onnxsat optimize`` in a fresh process: (exit code, wall s, peak RSS GiB, stderr)."""
    cmd = [
        sys.executable,
        "-m",
        "onnxsat",
        "optimize",
        str(src),
        "-o",
        str(dst),
        "--report-json",
        str(report),
    ]
    start = time.perf_counter()
    # --external-data: small models take the sidecar path too (past 2 GiB it is automatic).
    proc = subprocess.Popen(cmd + ["--quiet", "--external-data", *extra], stderr=subprocess.PIPE, text=True)
    stderr = proc.stderr.read() if proc.stderr else ""
    _pid, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, seconds, usage.ru_maxrss / 2**20, stderr.strip()  # ru_maxrss is KiB on Linux


def compare_files(original: Path, optimized: Path, batch: int = 2, seed: int = 0) -> float:
    """Max abs difference of the outputs, onnxruntime loading both models (and sidecars) by path."""
    import onnxruntime as ort

    outputs = []
    for path in (original, optimized):  # one session at a time: each holds all the weights
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        hidden = session.get_inputs()[0].shape[1]
        x = np.random.default_rng(seed).standard_normal((batch, hidden)).astype(np.float32)
        outputs.append(session.run(None, {"x": x})[0])
        del session
    ref, got = outputs
    if ref.shape != got.shape:
        return float("inf")
    return float(np.abs(ref - got).max())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hidden", type=int, default=8192, help="width of each layer (default %(default)s)")
    parser.add_argument("--layers", type=int, default=9, help="MatMul/Add/Relu blocks (default %(default)s)")
    parser.add_argument(
        "--workdir", type=Path, default=None, help="where to write (default: a temporary dir)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the files in --workdir")
    parser.add_argument("--json", type=Path, default=None, help="also write the summary as JSON")
    parser.add_argument("cli_args", nargs="*", help="extra flags for onnxsat optimize (after --)")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="onnxsat-large-", dir=args.workdir) as tmp:
        work = Path(tmp)
        src, dst, report_path = work / "large.onnx", work / "large.opt.onnx", work / "report.json"
        t0 = time.perf_counter()
        weight_bytes = build_large_model(src, hidden=args.hidden, layers=args.layers)
        built = time.perf_counter() - t0
        print(f"built {src.name}: {weight_bytes / 2**30:.2f} GiB of weights in {built:.1f} s", flush=True)
        code, seconds, rss_gib, stderr = run_cli(src, dst, report_path, args.cli_args)
        summary: dict[str, object] = {
            "weights_gib": round(weight_bytes / 2**30, 3),
            "hidden": args.hidden,
            "layers": args.layers,
            "exit_code": code,
            "optimize_seconds": round(seconds, 1),
            "peak_rss_gib": round(rss_gib, 2),
        }
        ok = code == 0
        if ok:
            report = json.loads(report_path.read_text())
            summary["verification"] = report["verification"]["status"]
            summary["nodes"] = f"{report['total_nodes_before']} -> {report['total_nodes_after']}"
            summary["stage_seconds"] = report["stage_seconds"]
            summary["output_sidecar_gib"] = round(dst.with_name(dst.name + ".data").stat().st_size / 2**30, 3)
            err = compare_files(src, dst)
            summary["independent_max_abs_err"] = err
            ok = report["verification"]["status"] == "passed" and err <= 1e-3
        else:
            summary["error"] = stderr.splitlines()[-1] if stderr else ""
        print(json.dumps(summary, indent=1))
        if args.json:
            args.json.write_text(json.dumps(summary, indent=1) + "\n")
        if args.keep and args.workdir:
            for p in work.iterdir():
                p.rename(args.workdir / p.name)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
