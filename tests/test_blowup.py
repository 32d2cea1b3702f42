"""Blow-up regression: many parallel MatMuls sharing one input (every pair is a multi-pattern
merge candidate) summed by a chain of Adds, with unguarded commutativity rules switched on, at
default budgets. Unbounded saturation of such a graph took tens of GB; the budgets (back-off
match limit, e-node, iteration and time limits per phase) must keep peak RSS under 2 GiB.

The run happens in a fresh interpreter, which reports its own peak RSS (VmHWM): the rusage
maxrss of a child forked from a large test worker starts at the worker's RSS.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

PEAK_RSS_LIMIT_MIB = 2048
N_MATMULS = 12

_CHILD = textwrap.dedent(
    f"""
    import json, sys
    import numpy as np
    from egglog import vars_
    from onnx import TensorProto, helper, numpy_helper

    import onnxsat
    from onnxsat.egraph import lang as L
    from onnxsat.rules import RULES
    from onnxsat.rules.registry import rewrite_rule

    # Test-only rules: plain commutativity, the textbook cause of e-graph blow-up.
    a, b = vars_("a b", L.Tensor)
    rewrite_rule(RULES, "test-commutativity", "add-commute", L.add(a, b), L.add(b, a))
    rewrite_rule(RULES, "test-commutativity", "mul-commute", L.mul(a, b), L.mul(b, a))

    rng = np.random.default_rng(0)
    n = {N_MATMULS}
    inits = [numpy_helper.from_array(rng.standard_normal((32, 32)).astype(np.float32), f"w{{i}}") for i in range(n)]
    nodes = [helper.make_node("MatMul", ["x", f"w{{i}}"], [f"m{{i}}"]) for i in range(n)]
    acc = "m0"
    for i in range(1, n):
        nodes.append(helper.make_node("Add", [acc, f"m{{i}}"], [f"s{{i}}"]))
        acc = f"s{{i}}"
    nodes.append(helper.make_node("Mul", [acc, "x"], ["y"]))
    graph = helper.make_graph(
        nodes,
        "blowup",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 32])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    _, report = onnxsat.optimize(model, onnxsat.Options())
    sat = report.saturation
    fired = report.saturation.rule_matches()
    print(json.dumps({{
        "stop": sat.stop_reason,
        "phases": [(p.name, p.stop_reason, p.iterations) for p in sat.phases],
        "enodes": sat.enodes_after,
        "verification": report.verification.status,
        "commute_fired": fired.get("add-commute", 0) + fired.get("mul-commute", 0),
        "merges_fired": fired.get("merge-parallel-matmul", 0),
        "peak_kib": next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:")),
    }}))
    """
)


def test_parallel_matmuls_with_commutativity_stay_under_2_gib(tmp_path) -> None:  # type: ignore[no-untyped-def]
    out_path, err_path = tmp_path / "out.txt", tmp_path / "err.txt"
    with out_path.open("w") as out, err_path.open("w") as err:
        proc = subprocess.Popen([sys.executable, "-c", _CHILD], stdout=out, stderr=err)
        _, status, _ = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    assert proc.returncode == 0, err_path.read_text()[-2000:]
    result = json.loads(out_path.read_text().strip().splitlines()[-1])
    # The child's own high-water mark: its rusage maxrss can start at the RSS of the (forked) test
    # worker, which is gigabytes late in a run.
    peak_mib = result["peak_kib"] / 1024
    assert result["commute_fired"] > 0 and result["merges_fired"] > 0, result  # the blow-up case really ran
    assert result["verification"] == "passed", result
    assert "plugin:test-commutativity" in [p[0] for p in result["phases"]], result
    assert peak_mib < PEAK_RSS_LIMIT_MIB, (peak_mib, result)
    print(f"peak RSS {peak_mib:.0f} MiB, {result}")
