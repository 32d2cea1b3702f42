"""The same input and options give a byte-identical output, whatever PYTHONHASHSEED is.

Two fresh interpreters with different hash seeds each optimize the same cases (every extractor,
a light model, a rule plugin loaded from a file) and print a digest per case; the digests must be
equal. Budgets stop saturation by iterations, never by wall time, which would depend on the load.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from .models import EXAMPLES, LIGHT_DIR

PLUGIN_DIR = EXAMPLES / "plugin" / "onnxsat_soft_activations"
CASES = [
    {"model": str(EXAMPLES / "transformer_block.onnx"), "extractor": "greedy-dag"},
    {"model": str(EXAMPLES / "transformer_block.onnx"), "extractor": "tree"},
    {"model": str(EXAMPLES / "transformer_block.onnx"), "extractor": "ilp"},
    {"model": str(EXAMPLES / "layout_algebra.onnx"), "extractor": "ilp"},
    {"model": str(LIGHT_DIR / "light_shufflenet.onnx"), "extractor": "greedy-dag"},
    {
        "model": str(PLUGIN_DIR / "soft_activations.onnx"),
        "extractor": "greedy-dag",
        "rule_files": [str(PLUGIN_DIR / "__init__.py")],
    },
]

_SCRIPT = """
import hashlib, json, sys, onnx, onnxsat
cases, cache = json.loads(sys.argv[1]), sys.argv[2]
for case in cases:
    options = onnxsat.Options(
        budgets=onnxsat.Budgets(iterations=6, seconds=600.0),
        extractor=case["extractor"],
        rule_files=tuple(case.get("rule_files", ())),
        entry_point_plugins=False,
        plugin_cache_dir=cache,
        verify=False,
    )
    model, report = onnxsat.optimize(onnx.load(case["model"]), options)
    digest = hashlib.sha256(model.SerializeToString()).hexdigest()
    print(json.dumps({"digest": digest, "stop": report.saturation.stop_reason, "nodes": report.total_after}))
"""


def test_every_extractor_is_byte_identical_across_hash_seeds(tmp_path) -> None:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _SCRIPT, json.dumps(CASES), str(tmp_path / f"cache-{seed}")],
            env={**os.environ, "PYTHONHASHSEED": seed},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed in ("1", "4242")
    ]
    runs = []
    for proc in procs:
        out, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, err
        runs.append([json.loads(line) for line in out.strip().splitlines()[-len(CASES) :]])
    first, second = runs
    assert len(first) == len(second) == len(CASES)
    for case, a, b in zip(CASES, first, second, strict=True):
        label = f"{os.path.basename(case['model'])} with {case['extractor']}"
        assert a["stop"] != "seconds", f"{label}: stopped by wall time, so the test proves nothing"
        assert a["digest"] == b["digest"], label
    # The plugin was really used: its fused ops are in the output (else it tests nothing new).
    assert first[-1]["nodes"] < 8
