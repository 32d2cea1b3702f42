"""egraph.run_cache: a saturation through the cached egg commands is the one EGraph.run gives.

Each side runs in a fresh process with one hash seed and no time budget: two saturations in one
process can take different (equally final) paths whichever way they are run, as egglog keeps
state between runs on an e-graph."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .models import EXAMPLES

REALMODELS = Path(__file__).parent / "data" / "realmodels"

_SATURATE = """
import dataclasses, json, sys
import onnx
import onnxsat.rules.schedule as schedule_module
from onnxsat.base.options import Options
from onnxsat.egraph import run_cache
from onnxsat.pipeline import Session

if sys.argv[2] == "public":
    schedule_module.run_cached = run_cache.run_public
options = Options(verify=False, plugin_cache_dir=sys.argv[3])
options = dataclasses.replace(options, budgets=dataclasses.replace(options.budgets, seconds=600.0))  # no time stop
with Session(onnx.load(sys.argv[1]), options) as session:
    report = session.saturate()
    cost = session.extract().cost
print(json.dumps([[[it.phase, it.enodes, it.matches] for it in report.iterations], report.enodes_after, cost]))
"""


@pytest.fixture(scope="module")
def rule_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One on-disk rule table for the module's processes, stored by this one (``RuleTable.default``
    keeps the table it holds in a cache that has none): each reads the rules (``rules.table_cache``)."""
    from onnxsat.rules.registry import RuleTable

    path = tmp_path_factory.mktemp("rule-cache")
    RuleTable.default(path)
    return path


def _saturation(path: Path, mode: str, cache: Path) -> list[object]:
    """Per iteration (phase, e-nodes, rule matches), the final e-node count and the extracted cost."""
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    done = subprocess.run(
        [sys.executable, "-c", _SATURATE, str(path), mode, str(cache)],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
        env=env,
    )
    return list(json.loads(done.stdout.splitlines()[-1]))


@pytest.mark.parametrize(
    "path", [EXAMPLES / "small_cnn.onnx", REALMODELS / "llama-ts-static.onnx"], ids=lambda p: p.stem
)
def test_cached_commands_saturate_as_egraph_run_does(path: Path, rule_cache: Path) -> None:
    cached = _saturation(path, "cached", rule_cache)
    assert cached == _saturation(path, "public", rule_cache)
    iterations = cached[0]
    assert isinstance(iterations, list) and any(matches for _, _, matches in iterations)  # reports were read


def test_a_sent_schedule_command_runs_as_egraph_run_does() -> None:
    """``schedule_command``/``send`` (rule verification's rounds) change an e-graph as ``EGraph.run``
    does, also in a state pushed after the command was built."""
    from egglog import EGraph, set_

    from onnxsat.egraph import lang as L
    from onnxsat.egraph.reach import closure, present_symbols, reach_cached
    from onnxsat.egraph.run_cache import schedule_command, send
    from onnxsat.egraph.shapes import analysis_rules, analysis_ruleset

    x = L.Tensor.input("x")
    facts = [set_(L.shape(x)).to(L.ivec([2, 3])), set_(L.dtype(x)).to(1), L.relu(L.relu(x))]
    scratch = EGraph()
    scratch.register(*facts)
    rules = analysis_rules()
    chosen, _ = closure(present_symbols(scratch), [reach_cached(r) for r in rules])
    saturate = analysis_ruleset([rules[i] for i in chosen]).saturate()  # what may fire: a fast declaration
    shapes = []
    for direct in (True, False):
        egraph = EGraph()
        command = schedule_command(egraph, saturate)
        egraph.push()
        egraph.register(*facts)
        updated = egraph.run(saturate).updated if direct else send(egraph, command)
        assert updated
        shapes.append(egraph.extract(L.shape(L.relu(L.relu(x)))))
        egraph.pop()
    assert shapes[0] == shapes[1] == L.ivec([2, 3])
