"""Security regressions through the real command line: nothing read from outside the model's
directory, nothing of the input overwritten, nothing unverified written, a clean exit for every
hostile input.

Every case of ``tests/hostile_corpus.py`` runs through ``onnxsat.cli.main``: the exit status must
be one the case allows, a refusal is one ``onnxsat: error:`` line without a traceback, every input
file keeps its sha256, and the canary's marker (a file outside every model directory) appears in
no file that was written.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnxsat import cli
from onnxsat.base import lazy_weights, modelio
from onnxsat.errors import BadInputError

from .hostile_corpus import BUILDERS, CANARY_MARKER, build_case

FAST = ["--max-iterations", "2", "--time-limit", "10", "--quiet"]


def _digests(paths: list[Path]) -> dict[Path, str]:
    return {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}


def _written(root: Path, before: set[Path]) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and not p.is_symlink() and p not in before]


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_hostile_corpus(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    case = build_case(tmp_path, name)
    inputs = case.inputs
    before = _digests(inputs)
    existing = {p for p in tmp_path.rglob("*") if p.is_file()}
    status = cli.main(["optimize", *case.args, *FAST])
    err = capsys.readouterr().err
    assert status in case.exits, f"{name}: exit {status}, stderr {err!r}"
    assert "Traceback" not in err
    if status != 0:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("onnxsat: error: "), err
        assert case.message in lines[0].lower(), lines[0]
    assert _digests(inputs) == before, "an input file changed"
    for path in _written(tmp_path, existing):
        assert CANARY_MARKER not in path.read_bytes(), f"{path} holds bytes of a file outside the model"
    if status != 0:
        assert not _written(tmp_path, existing), "a refused run wrote a file"


def test_forged_lazy_marker_is_refused(tmp_path: Path) -> None:
    """The key onnxsat once used for its lazy marker is refused, and the marker in use now is a
    per-process random key that no file carries."""
    case = build_case(tmp_path, "forged-basepath-4096")
    with pytest.raises(BadInputError, match="basepath"):
        modelio.load_model(case.model_dir / "model.onnx", lazy=True)
    assert lazy_weights.BASE_KEY.startswith("onnxsat-lazy-") and len(lazy_weights.BASE_KEY) > 40


def test_external_data_inside_symlink_loads_all_sizes(tmp_path: Path) -> None:
    """Legitimate references load through the same resolver, small (read) and large (lazy)."""
    from .hostile_corpus import _inside_symlink_ok

    for size, lazy in ((lazy_weights.WEIGHT_LAZY_MIN_BYTES // 2, False), (1 << 20, True)):
        case = _inside_symlink_ok(size)(tmp_path / str(size) / "case", tmp_path / "unused")
        model, sources = modelio.load_model_and_sources(
            case.model_dir / "model.onnx", lazy=True
        )
        (weight,) = model.graph.initializer
        assert lazy_weights.is_lazy(weight) == lazy
        values = lazy_weights.tensor_array(weight)
        assert np.array_equal(values.reshape(-1), np.arange(size // 4, dtype=np.float32))
        assert (case.model_dir / "real" / "w.bin").resolve() in sources


def test_report_json_path_that_is_the_weights_file_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    case = build_case(tmp_path, "output-is-weights-4096")
    weights = case.model_dir / "w.bin"
    before = _digests([weights])
    args = [case.args[0], "-o", str(tmp_path / "o.onnx"), "--report-json", str(weights)]
    assert cli.main(["optimize", *args, *FAST]) == 2
    assert "input" in capsys.readouterr().err
    assert _digests([weights]) == before


def test_external_keys_outside_the_spec_are_refused(tmp_path: Path) -> None:
    tensor = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[4])
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "w.bin"), ("length", "16"), ("onnxsat-lazy-x", str(tmp_path))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    (tmp_path / "w.bin").write_bytes(b"\0" * 16)
    graph = helper.make_graph(
        [helper.make_node("Identity", ["w"], ["y"])],
        "g",
        [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        [tensor],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(tmp_path / "m.onnx"))
    with pytest.raises(BadInputError, match="not allowed"):
        modelio.load_model(tmp_path / "m.onnx")


# ---------------------------------------------------------------------------------------------
# verification: nothing unverified written, the user's inputs, derived inputs, cost


def _reshape_by_input() -> onnx.ModelProto:
    """y = Reshape(x + 1, s) with the target shape ``s`` a graph input (random values would fail)."""
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["x", "one"], ["a"]),
            helper.make_node("Reshape", ["a", "s"], ["r"]),
            helper.make_node("ReduceSum", ["r", "axes"], ["y"], keepdims=1),
        ],
        "by_input",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4]),
            helper.make_tensor_value_info("s", TensorProto.INT64, [3]),
            helper.make_tensor_value_info("axes", TensorProto.INT64, [1]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b", "c"])],
        initializer=[onnx.numpy_helper.from_array(np.ones((), np.float32), "one")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_size_operands_fed_by_inputs_get_valid_values() -> None:
    from onnxsat.verification import make_inputs, reference_run

    model = _reshape_by_input()
    feeds = make_inputs(model, 0)
    assert list(feeds["s"]) == [2, 3, 4] and list(feeds["axes"]) == [0]
    reference = reference_run(model, seeds=(0, 1))
    assert reference.origin == "seeds [0, 1]" and len(reference.outputs) == 2


def test_verify_inputs_file_is_used_and_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model_path = tmp_path / "m.onnx"
    onnx.save(_reshape_by_input(), str(model_path))
    sample = tmp_path / "sample.npz"
    x = np.random.default_rng(3).standard_normal((2, 3, 4)).astype(np.float32)
    np.savez(sample, x=x, s=np.array([4, 3, 2]), axes=np.array([1]))
    out = tmp_path / "o.onnx"
    assert (
        cli.main(
            ["optimize", str(model_path), "-o", str(out), "--verify-inputs", str(sample), "--json", *FAST[:4]]
        )
        == 0
    )
    import json

    report = json.loads(capsys.readouterr().out)
    assert report["verification"]["status"] == "passed"
    assert "1 sample(s) from --verify-inputs" in report["verification"]["detail"]
    assert report["verification"]["seconds"] > 0
    bad = tmp_path / "bad.npz"
    np.savez(bad, x=x.astype(np.float64), s=np.array([4, 3, 2]), axes=np.array([1]))
    assert cli.main(["optimize", str(model_path), "-o", str(out), "--verify-inputs", str(bad), *FAST]) == 2
    assert "DOUBLE" in capsys.readouterr().err


def test_unverified_is_written_only_when_allowed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    case = build_case(tmp_path, "untyped-custom-op")
    out = Path(case.args[2])
    assert cli.main(["optimize", *case.args, *FAST]) == 2 and not out.exists()
    capsys.readouterr()
    assert cli.main(["optimize", *case.args, *FAST, "--allow-unverified"]) == 4
    err = capsys.readouterr().err
    assert out.is_file() and "WITHOUT verification" in err


def test_original_runs_once_per_seed_on_one_session(monkeypatch: pytest.MonkeyPatch) -> None:
    """Verification builds one session per model and runs the original once per seed."""
    from onnxsat import verification
    from onnxsat.base.options import Budgets, Options
    from onnxsat.pipeline import optimize

    sessions: list[int] = []
    real = verification.inference_session
    monkeypatch.setattr(
        verification, "inference_session", lambda m, level: (sessions.append(len(m.graph.node)), real(m, level))[1]
    )
    model = _reshape_by_input()
    _, report = optimize(model, Options(budgets=Budgets(iterations=2)))
    assert report.verification.status == "passed"
    assert len(sessions) == 2, sessions  # the original once, the optimized once
    assert "reference" in report.stage_seconds


# ---------------------------------------------------------------------------------------------
# caches and temp files


def _dead_pid() -> int:
    import subprocess

    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_cache_entries_are_checksummed_and_private(tmp_path: Path) -> None:
    from onnxsat.base import disk_cache

    directory = disk_cache.private_dir(tmp_path / "cache")
    assert directory is not None and (directory.stat().st_mode & 0o777) == 0o700
    entry = directory / "k.o"
    assert disk_cache.write(entry, b"object bytes") and disk_cache.read(entry) == b"object bytes"
    entry.write_bytes(entry.read_bytes()[:-3])  # truncated, as by a full disk or a kill
    assert disk_cache.read(entry) is None and not entry.exists()
    from onnxsat.kernels import jit
    from onnxsat.rules import plugins, table_cache

    for module in (disk_cache, jit, plugins, table_cache):  # the caches hold bytes and JSON, never pickles
        source = Path(module.__file__ or "").read_text()
        assert "import pickle" not in source and "pickle.load" not in source
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    with pytest.warns(UserWarning, match="open to other users"):
        assert disk_cache.private_dir(shared) is None
    (tmp_path / "link").symlink_to(directory)
    with pytest.warns(UserWarning, match="not a directory"):
        assert disk_cache.private_dir(tmp_path / "link") is None


def test_stale_temp_files_of_killed_runs_are_removed(tmp_path: Path) -> None:
    from onnxsat.base import disk_cache

    dead, alive = _dead_pid(), __import__("os").getpid()
    stale = tmp_path / f".k.o.{dead}.abc123.tmp"
    live = tmp_path / f".k.o.{alive}.def456.tmp"
    stale.write_bytes(b"x")
    live.write_bytes(b"x")
    assert disk_cache.write(tmp_path / "k.o", b"data")
    assert not stale.exists() and live.exists()
    # the final write of a model: .OUT.PID.*.tmp of a killed run goes on the next write
    out = tmp_path / "out.onnx"
    leftover = tmp_path / f".out.onnx.{dead}.zz9.tmp"
    leftover.write_bytes(b"half a model")
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    modelio.save_model_atomic(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), out)
    assert out.is_file() and not leftover.exists()


def test_kernel_cache_rejects_a_damaged_object_and_rebuilds_it(tmp_path: Path) -> None:
    from llvmlite import ir

    from onnxsat.kernels.jit import CompiledModule

    def module() -> ir.Module:
        mod = ir.Module(name="m")
        fn = ir.Function(mod, ir.FunctionType(ir.IntType(64), [ir.IntType(64)]), name="inc")
        builder = ir.IRBuilder(fn.append_basic_block("entry"))
        builder.ret(builder.add(fn.args[0], ir.Constant(ir.IntType(64), 1)))
        return mod

    first = CompiledModule(module(), tmp_path / "kernels")
    (entry,) = (tmp_path / "kernels").glob("*.o")
    entry.write_bytes(entry.read_bytes()[: len(entry.read_bytes()) // 2])  # truncated object file
    rebuilt = CompiledModule(module(), tmp_path / "kernels")
    assert not rebuilt.cache_hit and rebuilt.address("inc") != 0
    again = CompiledModule(module(), tmp_path / "kernels")
    assert again.cache_hit and first.key == again.key


# ---------------------------------------------------------------------------------------------
# what is printed


def test_missing_rules_file_is_an_error_even_when_quiet(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "m.onnx"
    onnx.save(_reshape_by_input(), str(model))
    assert (
        cli.main(
            ["optimize", str(model), "-o", str(tmp_path / "o.onnx"), "--rules", "/nonexistent.py", "--quiet"]
        )
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "/nonexistent.py" in err[0] and not (tmp_path / "o.onnx").exists()
    assert cli.main(["rules", "list", "--rules", "/nonexistent.py"]) == 2


def _log_of_negative() -> onnx.ModelProto:
    """y = x + Log(c) with c < 0: folding Log(c) makes numpy warn (invalid value)."""
    graph = helper.make_graph(
        [helper.make_node("Log", ["c"], ["l"]), helper.make_node("Add", ["x", "l"], ["y"])],
        "warns",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
        initializer=[onnx.numpy_helper.from_array(np.array([-1.0, 1.0, 2.0], np.float32), "c")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_quiet_prints_nothing_and_progress_is_plain_lines_off_a_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import warnings

    model = tmp_path / "m.onnx"
    onnx.save(_log_of_negative(), str(model))
    out = tmp_path / "o.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("default")  # as a fresh process has them
        assert cli.main(["optimize", str(model), "-o", str(out), "--quiet", *FAST[:4]]) == 0
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err == "", captured.err
        assert cli.main(["optimize", str(model), "-o", str(out), "--no-plugins", *FAST[:4]]) == 0
    captured = capsys.readouterr()
    assert "\r" not in captured.err and "onnxsat import" in captured.err  # one line per stage
    assert "RuntimeWarning" not in captured.err


def test_report_lists_the_plugins_that_ran(tmp_path: Path) -> None:
    from onnxsat.base.options import Budgets, Options
    from onnxsat.pipeline import optimize

    examples = Path(__file__).resolve().parent.parent / "examples"
    rule_file = examples / "plugin" / "onnxsat_soft_activations" / "__init__.py"  # defines PLUGIN
    from onnxsat.rules import plugins

    options = Options(budgets=Budgets(iterations=1), rule_files=(str(rule_file),), entry_point_plugins=False)
    try:
        _, report = optimize(_log_of_negative(), options)
    finally:
        for load in plugins.ensure_plugins([str(rule_file)], entry_points=False):
            plugins.unload_plugin(load)
    assert any(str(rule_file.resolve()) in line for line in report.plugins), report.plugins
    _, bare = optimize(_log_of_negative(), Options(budgets=Budgets(iterations=1), entry_point_plugins=False))
    assert bare.plugins == []
