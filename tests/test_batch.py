"""``onnxsat batch``: a process pool writes what a serial run writes, one bad model is one entry, and
a rerun redoes exactly the models whose input, options or version changed."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import pytest

import onnxsat
from onnxsat import cli
from onnxsat.batch import SIDECAR_SUFFIX, find_models, options_fingerprint, output_names, run_batch
from onnxsat.executors import ALL_CORES, ProcessExecutor, SerialExecutor, Task

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
FAST_FLAGS = ["--max-iterations", "2", "--rules-only", "core,algebraic", "--no-plugins", "--quiet"]


def outputs_of(outdir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(outdir.glob("*.onnx"))}


@pytest.fixture(scope="module")
def serial(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, onnxsat.Options]:
    """The three models optimized in this process: what every executor must reproduce."""
    out = tmp_path_factory.mktemp("serial")
    # A rule-table cache (a private folder): the pool's fresh workers load the built rules.
    options = dataclasses.replace(OPTIONS, plugin_cache_dir=str(tmp_path_factory.mktemp("cache")))
    summary = run_batch(MODELS, out, options, jobs=1)
    assert [m.status for m in summary.models] == ["written", "written", "written"], summary.to_json()
    return out, options


@pytest.mark.slow
@pytest.mark.xdist_group("batch-serial")
def test_process_pool_writes_the_serial_bytes(serial: tuple[Path, onnxsat.Options], tmp_path: Path) -> None:
    serial_out, options = serial
    summary = run_batch(MODELS, tmp_path, options, jobs=2)
    assert summary.executor == "ProcessExecutor" and summary.jobs == 2
    assert all(m.status == "written" and m.verification == "passed" for m in summary.models)
    assert outputs_of(tmp_path) == outputs_of(serial_out)
    assert len(outputs_of(tmp_path)) == 3
    assert not list(tmp_path.glob(".onnxsat-staging-*"))  # the staging folder is gone


@pytest.mark.xdist_group("batch-serial")  # with the others on `serial`: the fixture runs once
def test_one_bad_model_is_one_entry_and_the_rest_complete(
    serial: tuple[Path, onnxsat.Options], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    serial_out, _ = serial
    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / "broken.onnx").write_bytes(b"\x08\x07garbage that is not a model")
    shutil.copy(MODELS[0], inputs / "layout_algebra.onnx")
    out = tmp_path / "out"
    status = cli.main(
        ["batch", str(inputs), str(ROOT / "no-such-model.onnx"), "-o", str(out), "--jobs", "1", *FAST_FLAGS]
    )
    assert status == 1
    summary = json.loads((out / "summary.json").read_text())
    by_name = {Path(m["input"]).name: m for m in summary["models"]}
    assert by_name["layout_algebra.onnx"]["status"] == "written"
    assert (out / "layout_algebra.onnx").read_bytes() == (serial_out / "layout_algebra.onnx").read_bytes()
    for bad in ("broken.onnx", "no-such-model.onnx"):
        entry = by_name[bad]
        assert entry["status"] == "failed" and entry["nodes_after"] is None
        assert entry["error"] and "\n" not in entry["error"]
        assert not (out / bad).exists()
    assert summary["counts"] == {"failed": 2, "written": 1}
    err = capsys.readouterr().err
    assert "failed: " in err and "broken.onnx" in err


@pytest.mark.slow
def test_resume_skips_done_models_and_redoes_changed_ones(tmp_path: Path) -> None:
    model = tmp_path / "in" / "m.onnx"
    model.parent.mkdir()
    shutil.copy(MODELS[0], model)
    out = tmp_path / "out"

    def statuses(options: onnxsat.Options = OPTIONS, **kw: object) -> list[str]:
        return [m.status for m in run_batch([model.parent], out, options, jobs=1, **kw).models]  # type: ignore[arg-type]

    assert statuses() == ["written"]
    first = (out / "m.onnx").read_bytes()
    sidecar = json.loads((out / ("m.onnx" + SIDECAR_SUFFIX)).read_text())
    assert sidecar["version"] == onnxsat.__version__ and sidecar[
        "options_fingerprint"
    ] == options_fingerprint(OPTIONS)
    assert statuses() == ["skipped"]
    skipped = json.loads((out / "summary.json").read_text())["models"][0]
    assert skipped["nodes_after"] == sidecar["result"]["nodes_after"]  # the earlier run's figures
    assert statuses(force=True) == ["written"]
    assert statuses(onnxsat.Options(budgets=onnxsat.Budgets(iterations=1), rules_only=("core",))) == [
        "written"
    ]
    assert statuses() == ["written"]  # back to the first options: a new fingerprint again
    assert (out / "m.onnx").read_bytes() == first

    import onnx

    changed = onnx.load(str(model))
    changed.doc_string = "another input"
    onnx.save(changed, str(model))
    assert statuses() == ["written"]
    assert statuses() == ["skipped"]

    for key, value in (("version", "0.0.0-other"), ("input_sha256", "0" * 64), ("options_fingerprint", "x")):
        path = out / ("m.onnx" + SIDECAR_SUFFIX)
        record = json.loads(path.read_text())
        record[key] = value
        path.write_text(json.dumps(record))
        assert statuses() == ["written"], key
    (out / "m.onnx").write_bytes(b"replaced by hand")
    assert statuses() == ["written"]
    (out / "m.onnx").unlink()
    assert statuses() == ["written"]
    (out / ("m.onnx" + SIDECAR_SUFFIX)).write_text("{not json")
    assert statuses() == ["written"]


def test_fingerprint_sees_rule_file_contents(tmp_path: Path) -> None:
    rules = tmp_path / "plugin.py"
    rules.write_text("PLUGIN = None\n")
    options = onnxsat.Options(rule_files=(str(rules),))
    before = options_fingerprint(options)
    assert before == options_fingerprint(onnxsat.Options(rule_files=(str(rules),), progress=True))
    rules.write_text("PLUGIN = None  # edited\n")
    assert options_fingerprint(options) != before
    assert options_fingerprint(options, external_data=True) != options_fingerprint(options)


def test_inputs_lists_and_folders_and_clashing_names(tmp_path: Path) -> None:
    for sub in ("a", "b", ".hidden"):
        (tmp_path / sub).mkdir()
        shutil.copy(MODELS[0], tmp_path / sub / "model.onnx")
    out = tmp_path / "out"
    out.mkdir()
    shutil.copy(MODELS[0], out / "model.onnx")  # an earlier output: not an input of a folder search
    listing = tmp_path / "list.txt"
    listing.write_text("# models\nb/model.onnx\n\na/model.onnx\n")
    found = find_models([f"@{listing}", tmp_path, tmp_path / "a" / "model.onnx"], exclude=out)
    assert [p.resolve() for p in found] == [(tmp_path / s / "model.onnx").resolve() for s in ("b", "a")]
    names = output_names(found)
    assert names[1] == "model.onnx" and names[0].startswith("model-") and names[0].endswith(".onnx")
    assert output_names(list(reversed(found))) == list(reversed(names))  # the order given does not matter
    with pytest.raises(onnxsat.base.errors.BadInputError, match="list file"):
        find_models([f"@{tmp_path / 'missing.txt'}"])


def _value_or_crash(key: int, marker: str) -> int:
    """A task whose worker dies the first time (the marker records it), as a killed worker would."""
    if key == 1 and not os.path.exists(marker):
        Path(marker).write_text("x")
        os._exit(9)
    return key * 10


def _raises(key: int) -> int:
    raise ValueError(f"bad cell {key}\nsecond line")


def test_process_pool_retries_a_dead_worker_once_and_reports_task_errors(tmp_path: Path) -> None:
    marker = str(tmp_path / "crashed")
    executor = ProcessExecutor(2)
    try:
        tasks = [Task(k, _value_or_crash, (k, marker)) for k in range(4)] + [
            Task(9, _raises, (9,), cpus=ALL_CORES)
        ]
        done = {d.key: d for d in executor.run(tasks)}
    finally:
        executor.close()
    assert os.path.exists(marker)
    assert {k: d.value for k, d in done.items() if d.ok} == {0: 0, 1: 10, 2: 20, 3: 30}
    assert done[1].attempts == 2
    assert not done[9].ok and done[9].error == "ValueError: bad cell 9"
    serial = {d.key: d for d in SerialExecutor().run([Task(9, _raises, (9,))])}
    assert serial[9].error == done[9].error


def _session_threads() -> int:
    """The intra-op threads of a session built without naming any (0: onnxruntime's default)."""
    from onnx import TensorProto, helper

    from onnxsat.latency import ort_session

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return int(ort_session(model).get_session_options().intra_op_num_threads)


def test_pool_workers_verify_on_their_share_of_the_cores() -> None:
    executor = ProcessExecutor(2)
    try:
        done = {
            d.key: d.value
            for d in executor.run(
                [Task("shared", _session_threads), Task("alone", _session_threads, cpus=ALL_CORES)]
            )
        }
    finally:
        executor.close()
    assert done == {"shared": max(1, (os.cpu_count() or 1) // 2), "alone": 0}


def _always_crash() -> None:
    os._exit(9)


def test_a_task_that_kills_every_worker_is_reported_not_lost() -> None:
    executor = ProcessExecutor(1, retries=1)
    try:
        (done,) = list(executor.run([Task("k", _always_crash)]))
    finally:
        executor.close()
    assert not done.ok and done.error == "worker process died" and done.attempts == 2


def test_batch_takes_optimize_flags_and_refuses_bad_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["batch", "--help"]) == 0
    text = capsys.readouterr().out
    for flag in (
        "--jobs",
        "--force",
        "--summary",
        "--ray",
        "--ray-address",
        "--max-iterations",
        "--rules-only",
    ):
        assert flag in text
    for flag in ("--cost-target", "--no-verify", "--external-data", "--phase-budget", "--input-shape"):
        assert flag in text  # the same flags as optimize, from cli_args
    assert cli.main(["batch", str(MODELS[0]), "-o", str(tmp_path / "o"), "--no-shared-fs"]) == 2
    assert "--no-shared-fs needs --ray" in capsys.readouterr().err
    assert (
        cli.main(["batch", str(tmp_path / "empty"), "-o", str(tmp_path / "o2")]) == 1
    )  # a missing path: one entry
    empty = tmp_path / "nothing"
    empty.mkdir()
    assert cli.main(["batch", str(empty), "-o", str(tmp_path / "o3")]) == 2
    assert "no models found" in capsys.readouterr().err


@pytest.mark.xdist_group("batch-serial")
def test_external_data_outputs_are_moved_in_with_their_weights(
    serial: tuple[Path, onnxsat.Options], tmp_path: Path
) -> None:
    import onnx
    from onnx import numpy_helper

    serial_out, options = serial
    summary = run_batch([MODELS[1]], tmp_path, options, jobs=1, external_data=True)
    assert [m.status for m in summary.models] == ["written"]
    assert (tmp_path / "small_cnn.onnx.data").is_file()
    got = onnx.load(str(tmp_path / "small_cnn.onnx"))
    want = onnx.load(str(serial_out / "small_cnn.onnx"))
    assert [n.op_type for n in got.graph.node] == [n.op_type for n in want.graph.node]
    for a, b in zip(got.graph.initializer, want.graph.initializer, strict=True):
        assert a.name == b.name and numpy_helper.to_array(a).tobytes() == numpy_helper.to_array(b).tobytes()
    rerun = run_batch([MODELS[1]], tmp_path, options, jobs=1, external_data=True)
    assert [m.status for m in rerun.models] == ["skipped"]
    again = run_batch([MODELS[1]], tmp_path, options, jobs=1)  # inline now: another fingerprint
    assert [m.status for m in again.models] == ["written"]
