"""Region-wise saturation on worker processes (``Options.jobs``, ``onnxsat.jobs``) and replay off.

``--jobs 2`` must write the bytes ``--jobs 1`` writes whenever no region stops on a time budget
(the budgets here are iterations only), a worker that fails or dies must never cost a wrong
output, and saturating every region on its own (replay off) must be no worse than replaying.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import onnx
import pytest

import onnxsat
from onnxsat import jobs
from onnxsat.base.options import Budgets
from onnxsat.by_regions import price
from onnxsat.cli import build_parser, options_from_args
from tests.test_by_regions import LAYER, random_gammas, residual_stack

REALMODELS = Path(__file__).parent / "data" / "realmodels"
ITERATIONS_ONLY = Budgets(iterations=2, seconds=1e9)
"""No time budget is ever reached: the result depends on the rules, the model and counts only."""


CACHE: str | None = None
"""The rule-table cache the workers read (their start-up: the table read, not built again)."""


@pytest.fixture(scope="module", autouse=True)
def rule_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    global CACHE
    CACHE = str(tmp_path_factory.mktemp("rule-cache"))


def regions(jobs: int = 1, size: int = LAYER, **changes: object) -> onnxsat.Options:
    return onnxsat.Options(
        region_nodes=1,
        region_size=size,
        jobs=jobs,
        budgets=ITERATIONS_ONLY,
        verify=False,
        plugin_cache_dir=CACHE,
        **changes,
    )


def test_two_jobs_write_the_bytes_of_one() -> None:
    model = residual_stack(random_gammas(2))
    serial, _ = onnxsat.optimize(model, regions(1, region_replay=False))
    parallel, report = onnxsat.optimize(model, regions(2, region_replay=False))
    assert report.regions is not None and (report.regions.distinct, report.regions.jobs) == (2, 2)
    assert not [w for w in report.warnings if "worker" in w]
    assert parallel.SerializeToString() == serial.SerializeToString()


@pytest.mark.slow
def test_two_jobs_write_the_bytes_of_one_on_a_real_decoder() -> None:
    """qwen2 (dynamo export, 148 nodes) cut into regions of ~40 nodes: three distinct regions and
    two windows, each saturated in a worker with --jobs 2, in this process with --jobs 1."""
    model = onnx.load(REALMODELS / "qwen2-dynamo-static.onnx")
    serial, serial_report = onnxsat.optimize(model, regions(1, 40))
    parallel, report = onnxsat.optimize(model, regions(2, 40))
    summary = report.regions
    assert summary is not None and summary.jobs == 2
    assert summary.distinct >= 2 and summary.windows_distinct >= 1
    assert not [w for w in report.warnings if "worker" in w]  # every part was solved by a worker
    assert parallel.SerializeToString() == serial.SerializeToString()
    assert report.cost_after == serial_report.cost_after
    assert [(i.phase, i.enodes, i.matches) for i in report.saturation.iterations] == [
        (i.phase, i.enodes, i.matches) for i in serial_report.saturation.iterations
    ]


def test_jobs_do_not_turn_regions_on() -> None:
    model = residual_stack(random_gammas(2))
    _, report = onnxsat.optimize(model, replace(regions(2), region_nodes=0))
    assert report.regions is None
    assert any("--jobs 2 unused" in w for w in report.warnings)


def test_replay_off_saturates_every_region_and_is_no_worse() -> None:
    model = residual_stack(random_gammas(4))
    replayed, on = onnxsat.optimize(model, replace(regions(), verify=True))
    alone, off = onnxsat.optimize(model, replace(regions(), verify=True, region_replay=False))
    assert on.regions is not None and off.regions is not None
    assert (on.regions.distinct, on.regions.replayed) == (1, 3)
    assert (off.regions.distinct, off.regions.replayed) == (4, 0)
    assert off.regions.windows_replayed == 0 and not off.regions.replay
    assert off.verification.status == "passed"
    assert len(alone.graph.node) <= len(replayed.graph.node)
    with onnxsat.Session(model, onnxsat.Options(region_nodes=0)) as session:
        assert price(session, alone) <= price(session, replayed) * (1 + 1e-9)


def died(task: jobs.Task) -> jobs.Answer:
    """A worker's task that kills its process (sent to workers by reference, as ``jobs.solve`` is)."""
    os._exit(3)


def failed(task: jobs.Task) -> jobs.Answer:
    """A worker's task that answers with an error."""
    return jobs.Answer(error="RuntimeError: refused in the worker")


@pytest.mark.parametrize("task, warning", [(died, "died"), (failed, "failed in a worker process")])
def test_a_worker_that_dies_or_fails_costs_time_not_the_output(
    monkeypatch: pytest.MonkeyPatch, task: object, warning: str
) -> None:
    model = residual_stack(random_gammas(2))
    serial, _ = onnxsat.optimize(model, regions(1, region_replay=False))
    monkeypatch.setattr(jobs, "solve", task)
    parallel, report = onnxsat.optimize(model, replace(regions(2, region_replay=False), verify=True))
    assert any(warning in w for w in report.warnings), report.warnings
    assert report.verification.status == "passed"
    assert parallel.SerializeToString() == serial.SerializeToString()


def test_the_flags_reach_the_options() -> None:
    args = build_parser().parse_args(["optimize", "in.onnx", "out.onnx", "--jobs", "3", "--no-region-replay"])
    options = options_from_args(args)
    assert (options.jobs, options.region_replay) == (3, False)
    defaults = options_from_args(build_parser().parse_args(["optimize", "in.onnx", "out.onnx"]))
    assert (defaults.jobs, defaults.region_replay) == (1, True)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["optimize", "in.onnx", "out.onnx", "--jobs", "0"])
