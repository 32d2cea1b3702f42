"""``--time-limit S`` on hostile graphs: from the end of loading to the written file at most 2 S
plus verification time, with a valid result (exit 0) or a clean refusal (exit 2, one line).

Graphs (written to a temporary directory): chains of ``--unary`` unary nodes (Relu, Neg,
Identity in turn) and chains of ``--binary`` Add/Mul nodes, each with its own constant
initializer (the default 300 is one that imports within the limit, so it is optimized). Each runs through the real command line in a fresh process,
``onnxsat optimize IN -o OUT --time-limit S --report-json R --quiet``, for every S in
``--limits``. The report's ``seconds_after_load`` (wall time from the model read to the written
file) less its verification stages (``samples``, ``reference``, ``verify`` of ``stage_seconds``,
each stage's total over reruns) is the time after loading; less the fixed cost of the
optimizer's modules and rule library (``modules``, ``rules``, ``declare``: imported, loaded and
declared into egglog, the same for every model and paid once a process) it is what the floor bounds. Both are printed, and the wall time of the
process (which also holds Python start-up and reading the file).

    nice -n 19 python benchmarks/time_limit.py [--unary 50000 --binary 5000 300 --limits 5 20] [--md out.md]

Exit status 1 when a run breaks the floor, exits with another status than 0 or 2, or prints more
than one line on a refusal.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

VERIFICATION_STAGES = ("samples", "reference", "verify")
FIXED_STAGES = ("modules", "rules", "declare")
"""The optimizer's modules imported, the rule library loaded and declared into egglog: a cost of
the process, the same for any model."""
WIDTH = 16


def unary_chain(n: int) -> onnx.ModelProto:
    """``n`` unary nodes on a [1, 16] float input: Relu, Neg, Identity in turn."""
    ops = ("Relu", "Neg", "Identity")
    nodes = [
        helper.make_node(ops[i % 3], [f"t{i}" if i else "x"], [f"t{i + 1}" if i + 1 < n else "y"])
        for i in range(n)
    ]
    return _model(nodes, [], "unary_chain")


def binary_chain(n: int, seed: int = 0) -> onnx.ModelProto:
    """``n`` nodes Add, Mul in turn, each with its own [16] constant."""
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array(rng.uniform(0.5, 1.5, WIDTH).astype(np.float32), f"c{i}") for i in range(n)
    ]
    nodes = [
        helper.make_node(
            "Add" if i % 2 == 0 else "Mul",
            [f"t{i}" if i else "x", f"c{i}"],
            [f"t{i + 1}" if i + 1 < n else "y"],
        )
        for i in range(n)
    ]
    return _model(nodes, inits, "binary_chain")


def _model(nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto], name: str) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, WIDTH])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@dataclass
class Run:
    graph: str
    nodes: int
    limit: float
    exit_code: int
    wall: float
    after_load: float
    """From the model read to the written file, less verification."""
    verification: float
    fixed: float
    """The rule library's load and declaration (within ``after_load``)."""
    stages: dict[str, float]
    stderr: str

    @property
    def ok(self) -> bool:
        if self.exit_code == 2:
            return len(self.stderr.strip().splitlines()) == 1 and self.wall <= 2 * self.limit + 60
        return self.exit_code == 0 and self.after_load - self.fixed <= 2 * self.limit


def run_one(path: Path, graph: str, nodes: int, limit: float, extra: list[str] | None = None) -> Run:
    """One ``onnxsat optimize`` of ``path`` in a fresh process, timed from its report."""
    out, report = path.with_suffix(f".{limit:g}.opt.onnx"), path.with_suffix(f".{limit:g}.json")
    cmd = [
        sys.executable,
        "-m",
        "onnxsat",
        "optimize",
        str(path),
        "-o",
        str(out),
        "--time-limit",
        f"{limit:g}",
    ]
    cmd += ["--report-json", str(report), "--quiet", *(extra or [])]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    stages: dict[str, float] = {}
    after_load = 0.0
    if proc.returncode == 0 and report.is_file():
        data = json.loads(report.read_text())
        stages, after_load = data["stage_seconds"], data["seconds_after_load"]
        onnx.checker.check_model(str(out), full_check=True)
    verification = sum(v for k, v in stages.items() if k in VERIFICATION_STAGES)
    fixed = sum(v for k, v in stages.items() if k in FIXED_STAGES)
    after_load -= verification
    return Run(
        graph, nodes, limit, proc.returncode, wall, after_load, verification, fixed, stages, proc.stderr
    )


def render(runs: list[Run]) -> str:
    lines = [
        "| graph | nodes | S | exit | after load (s) | fixed: modules, rules, declare (s) | bounded (s) | 2 S | verification (s) | wall (s) | floor | slowest stages |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in runs:
        top = sorted(r.stages.items(), key=lambda kv: -kv[1])[:4]
        slow = ", ".join(f"{k} {v:.1f}" for k, v in top) or r.stderr.strip()[:80]
        lines.append(
            f"| {r.graph} | {r.nodes} | {r.limit:g} | {r.exit_code} | {r.after_load:.1f} | {r.fixed:.1f} |"
            f" {r.after_load - r.fixed:.1f} | {2 * r.limit:g} |"
            f" {r.verification:.1f} | {r.wall:.1f} | {'holds' if r.ok else 'BROKEN'} | {slow} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--unary", type=int, nargs="*", default=[50_000], help="sizes of the unary chain")
    parser.add_argument("--binary", type=int, nargs="*", default=[5_000, 300], help="sizes of the Add/Mul chain")
    parser.add_argument("--limits", type=float, nargs="+", default=[5.0, 20.0])
    parser.add_argument("--md", default=None, help="also write the table to this file")
    args = parser.parse_args(argv)
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        graphs = [("unary", n, unary_chain) for n in args.unary] + [("add-mul", n, binary_chain) for n in args.binary]
        for name, n, build in graphs:
            path = Path(tmp) / f"{name}{n}.onnx"
            onnx.save(build(n), str(path))
            for limit in args.limits:
                run = run_one(path, name, n, limit)
                print(
                    f"{name} {n} S={limit:g}: exit {run.exit_code}, after load {run.after_load:.1f} s,"
                    f" verification {run.verification:.1f} s, wall {run.wall:.1f} s {run.stages}",
                    flush=True,
                )
                if run.exit_code not in (0,):
                    print(run.stderr.strip()[-500:], flush=True)
                runs.append(run)
    table = render(runs)
    print(table)
    if args.md:
        load = os.getloadavg()
        Path(args.md).write_text(
            f"load average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}\n\n{table}\n"
        )
    return 0 if all(r.ok for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
