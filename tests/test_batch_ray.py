"""Batch and study cells on a local Ray instance (``ray.init(num_cpus=2)``, started once for the
module): the outputs are a serial run's bytes, a task whose worker is killed is retried and the
batch completes, and without Ray ``--ray`` is a one-line error (exit 2)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import onnx
import pytest

import onnxsat
from onnxsat import study
from onnxsat.batch import run_batch
from onnxsat.executors import RayExecutor, Task, ray_available

from .models import EXAMPLES

ROOT = Path(__file__).resolve().parents[1]
MODELS = [
    EXAMPLES / "layout_algebra.onnx",
    EXAMPLES / "small_cnn.onnx",
    ROOT / "tests" / "data" / "realmodels" / "shufflenet_v2_x1_0-ts-static.onnx",
]
OPTIONS = onnxsat.Options(
    budgets=onnxsat.Budgets(iterations=2, seconds=10.0), rules_only=("core", "algebraic")
)

pytestmark = pytest.mark.xdist_group("ray")  # one Ray instance at a time on the machine
needs_ray = pytest.mark.skipif(
    not ray_available(), reason="Ray is not installed (pip install 'onnxsat[ray]')"
)


@pytest.fixture(scope="module")
def ray_executor() -> Iterator[RayExecutor]:
    """A local Ray instance of 2 cores, started once for the module (its start-up is the dear part)."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield RayExecutor()  # joins the instance above, leaves it running
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def options(tmp_path_factory: pytest.TempPathFactory) -> onnxsat.Options:
    """``OPTIONS`` with a rule-table cache (a private folder), so each Ray worker loads the built
    rules instead of building them: the fixed cost every fresh worker process pays."""
    return dataclasses.replace(OPTIONS, plugin_cache_dir=str(tmp_path_factory.mktemp("cache")))


@pytest.fixture(scope="module")
def serial(tmp_path_factory: pytest.TempPathFactory, options: onnxsat.Options) -> Path:
    out = tmp_path_factory.mktemp("serial")
    summary = run_batch(MODELS, out, options, jobs=1)
    assert all(m.status == "written" for m in summary.models), summary.to_json()
    return out


def outputs_of(outdir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(outdir.glob("*.onnx"))}


@pytest.mark.slow
@needs_ray
def test_batch_on_ray_writes_the_serial_bytes(
    ray_executor: RayExecutor, serial: Path, options: onnxsat.Options, tmp_path: Path
) -> None:
    shared = tmp_path / "shared"
    summary = run_batch(MODELS, shared, options, executor=ray_executor)
    assert summary.executor == "RayExecutor"
    assert [m.status for m in summary.models] == ["written"] * 3
    assert outputs_of(shared) == outputs_of(serial)
    shipped = tmp_path / "shipped"  # no shared filesystem: bytes through the object store both ways
    summary = run_batch(MODELS[1:2], shipped, options, executor=ray_executor, shared_fs=False)
    assert [m.status for m in summary.models] == ["written"]
    assert outputs_of(shipped) == {MODELS[1].name: (serial / MODELS[1].name).read_bytes()}


@needs_ray
def test_a_killed_ray_task_is_retried_and_the_batch_completes(
    ray_executor: RayExecutor, serial: Path, options: onnxsat.Options, tmp_path: Path
) -> None:
    marker = tmp_path / "first-attempt"
    out = tmp_path / "out"
    summary = run_batch(MODELS[:1], out, options, executor=ray_executor, crash_once_marker=str(marker))
    assert marker.exists()  # the first attempt ran and its worker process exited
    assert [m.status for m in summary.models] == ["written"]
    assert outputs_of(out) == {MODELS[0].name: (serial / MODELS[0].name).read_bytes()}


def _crash() -> None:
    import os

    os._exit(9)


@needs_ray
def test_a_task_whose_worker_always_dies_is_reported(ray_executor: RayExecutor) -> None:
    (done,) = list(ray_executor.run([Task("k", _crash)]))
    assert not done.ok and done.attempts == 2 and "\n" not in (done.error or "")


@pytest.mark.slow
@needs_ray
def test_ablation_cells_on_ray_match_the_serial_records(
    ray_executor: RayExecutor, options: onnxsat.Options
) -> None:
    model = onnx.load(str(EXAMPLES / "layout_algebra.onnx"))
    serial = study.ablation("layout_algebra", model, options, families=["core"])
    timed = study.ablation(
        "layout_algebra",
        model,
        options,
        families=["core"],
        latency_rounds=2,
        calls_per_round=1,
        executor=ray_executor,
    )
    latency = {"latency_full_ms", "latency_ms", "latency_ratio", "latency_ci"}
    assert [{k: v for k, v in r.items() if k not in latency} for r in timed] == serial
    assert [r["disabled"] for r in timed] == ["(none)", "core"]
    assert all(r["latency_ms"] > 0 for r in timed)
    assert ray_executor.node_cpus() == 2  # what each timed cell asked for (ALL_CORES: the whole node)
    models = {"layout_algebra": model, "small_cnn": onnx.load(str(EXAMPLES / "small_cnn.onnx"))}
    methods = ("tree", "greedy-dag")

    def untimed(records: list[dict[str, object]]) -> list[dict[str, object]]:
        return [{k: v for k, v in r.items() if k != "seconds"} for r in records]

    sweep = study.extractor_sweep(models, options, methods, executor=ray_executor)
    assert untimed(sweep) == untimed(study.extractor_sweep(models, options, methods))
    assert [(r["model"], r["extractor"]) for r in sweep] == [(m, e) for m in models for e in methods]


def test_ray_flag_without_ray_is_a_one_line_error(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "sys.modules['ray'] = None  # import ray raises ImportError, as when it is not installed\n"
        "from onnxsat.cli import main\n"
        f"sys.exit(main(['batch', {str(MODELS[0])!r}, '-o', {str(tmp_path / 'out')!r}, '--ray']))\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert lines == ["onnxsat: error: Ray is not installed: pip install 'onnxsat[ray]'"]
    assert not (tmp_path / "out").exists()  # refused before any work
