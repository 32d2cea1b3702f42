"""The ``onnxsat`` command line: flags, exit codes, what is (not) written, and help texts.

Two kinds of tests. Most run ``main([...])`` with a stand-in ``onnxsat.pipeline`` (installed in
``sys.modules``) so that flag mapping and error handling are checked exactly and fast; the
end-to-end tests at the bottom run the real pipeline on ``examples/small_cnn.onnx``, both in
process and as ``python -m onnxsat`` in a subprocess.
"""

from __future__ import annotations

import json
import subprocess
import sys
import types
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import onnx
import pytest

from onnxsat import cli
from onnxsat.base.errors import BadInputError, VerificationError
from onnxsat.base.options import Budgets, Options
from onnxsat.base.report import Report, VerificationSummary
from onnxsat.cli_args import plugin_cache_dir

ROOT = Path(__file__).resolve().parent.parent
SMALL_CNN = ROOT / "examples" / "small_cnn.onnx"
# Small budgets keep the end-to-end runs quick; they still exercise every stage.
FAST = ["--max-iterations", "3", "--time-limit", "20"]

ALL_OPTIMIZE_FLAGS = [
    "--output",
    "--report-json",
    "--no-verify",
    "--max-iterations",
    "--max-enodes",
    "--time-limit",
    "--match-limit",
    "--input-shape",
    "--rules-only",
    "--disable-rules",
    "--cost-target",
    "--extractor",
    "--materialize-constants",
    "--external-data",
    "--quiet",
    "--json",
    "--debug",
]


def run_module(*args: str | Path, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``python -m onnxsat ARGS`` in a fresh interpreter, as a user would run it."""
    return subprocess.run(
        [sys.executable, "-m", "onnxsat", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def assert_one_line_error(stderr: str) -> None:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("onnxsat: "), stderr
    assert "Traceback" not in stderr


class FakePipeline:
    """Stands in for ``onnxsat.pipeline``: records the options and returns or raises on demand."""

    def __init__(self) -> None:
        self.calls: list[Options] = []
        self.raises: BaseException | None = None

    def optimize(
        self, model: onnx.ModelProto, options: Options | None = None
    ) -> tuple[onnx.ModelProto, Report]:
        self.calls.append(options if options is not None else Options())
        if self.raises is not None:
            raise self.raises
        out = onnx.ModelProto()
        out.CopyFrom(model)
        report = Report(
            model_name=model.graph.name,
            opset=model.opset_import[0].version,
            nodes_before={"Conv": 3, "Relu": 3},
            nodes_after={"Conv": 3, "Relu": 3},
            extractor="greedy-dag",
            verification=VerificationSummary("passed"),
        )
        return out, report


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakePipeline:
    pipeline = FakePipeline()
    module = types.ModuleType("onnxsat.pipeline")
    module.optimize = pipeline.optimize  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "onnxsat.pipeline", module)
    return pipeline


@pytest.fixture
def no_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if the CLI gets as far as loading the model or optimizing it."""

    def forbidden(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError("the CLI started work before rejecting its arguments")

    module = types.ModuleType("onnxsat.pipeline")
    module.optimize = forbidden  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "onnxsat.pipeline", module)
    monkeypatch.setattr("onnxsat.base.modelio.load_model", forbidden)


# ---------------------------------------------------------------------------------------------
# help and version


def test_main_help_describes_commands(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "optimize" in out
    assert "--version" in out
    assert "onnxsat optimize examples/small_cnn.onnx -o small_cnn.opt.onnx" in out


def test_optimize_help_describes_every_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["optimize", "--help"]) == 0
    out = capsys.readouterr().out
    for flag in ALL_OPTIMIZE_FLAGS:
        assert flag in out, flag
    assert "examples:" in out
    assert "exit status:" in out
    for action in cli.build_parser()._subparsers._group_actions[0].choices["optimize"]._actions:  # type: ignore[union-attr]
        assert action.help, f"{action.option_strings or action.dest} has no help text"


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"onnxsat {metadata.version('onnxsat')}"


def test_no_command_prints_usage_and_fails(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 2
    assert "usage: onnxsat" in capsys.readouterr().err


def test_module_help_and_version(tmp_path: Path) -> None:
    res = run_module("--help", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "usage: onnxsat" in res.stdout
    res = run_module("optimize", "--help", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "--input-shape" in res.stdout
    res = run_module("--version", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == f"onnxsat {metadata.version('onnxsat')}"


def test_help_does_not_import_the_heavy_stack(tmp_path: Path) -> None:
    """``onnxsat --help`` must answer instantly: no egglog, onnxruntime or onnx behind it."""
    code = (
        "import sys\n"
        "from onnxsat.cli import main\n"
        "assert main(['optimize', '--help']) == 0\n"
        "heavy = sorted(m for m in ('egglog', 'onnxruntime', 'onnx', 'llvmlite') if m in sys.modules)\n"
        "print('HEAVY=' + ','.join(heavy))\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    assert "HEAVY=\n" in res.stdout, res.stdout


# ---------------------------------------------------------------------------------------------
# flags -> Options


def test_defaults_map_to_default_options(fake: FakePipeline, tmp_path: Path) -> None:
    assert cli.main(["optimize", str(SMALL_CNN), "-o", str(tmp_path / "out.onnx")]) == 0
    assert fake.calls == [Options(progress=True, plugin_cache_dir=plugin_cache_dir())]


def test_onnxsat_cache_dir_is_the_default_cache_of_the_api_and_the_cli(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("ONNXSAT_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert Options().plugin_cache_dir is None
    assert plugin_cache_dir() == str(tmp_path / "xdg" / "onnxsat")
    monkeypatch.setenv("ONNXSAT_CACHE_DIR", str(tmp_path / "mine"))
    assert Options().plugin_cache_dir == plugin_cache_dir() == str(tmp_path / "mine")
    assert Options(plugin_cache_dir=None).plugin_cache_dir is None  # an explicit None still means no cache


def test_every_flag_maps_to_options(fake: FakePipeline, tmp_path: Path) -> None:
    argv = [
        "optimize",
        str(SMALL_CNN),
        str(tmp_path / "out.onnx"),
        "--no-verify",
        "--max-iterations",
        "5",
        "--max-enodes",
        "1234",
        "--time-limit",
        "2.5",
        "--match-limit",
        "77",
        "--input-shape",
        "input:1,3,32,32",
        "--rules-only",
        "algebraic, fusion",
        "--rules-only",
        "layout",
        "--disable-rules",
        "some-rule",
        "--cost-target",
        "ort-cpu",
        "--extractor",
        "tree",
        "--materialize-constants",
        "--quiet",
    ]
    assert cli.main(argv) == 0
    (options,) = fake.calls
    assert options.budgets == Budgets(iterations=5, enodes=1234, seconds=2.5, match_limit=77, whole_run=True)
    assert options.rules_only == ("algebraic", "fusion", "layout")
    assert options.disable_rules == ("some-rule",)
    assert options.target == "ort-cpu"
    assert options.extractor == "tree"
    assert options.verify is False
    assert options.input_shapes == {"input": (1, 3, 32, 32)}
    assert options.materialize_constants is True
    assert options.progress is False


@pytest.mark.parametrize("flag", ["--quiet", "--json"])
def test_quiet_and_json_turn_progress_off(fake: FakePipeline, tmp_path: Path, flag: str) -> None:
    assert cli.main(["optimize", str(SMALL_CNN), "-o", str(tmp_path / "out.onnx"), flag]) == 0
    assert fake.calls[0].progress is False


@pytest.mark.parametrize(
    "extra",
    [
        ["--max-iterations", "-1"],
        ["--max-iterations", "many"],
        ["--max-enodes", "0"],
        ["--time-limit", "0"],
        ["--time-limit", "nan"],
        ["--match-limit", "1.5"],
        ["--cost-target", "cuda"],
        ["--target", "ort-cpu"],  # the cost model is --cost-target; --target is compile's
        ["--extractor", "simplex"],
        ["--ilp-time-limit", "0"],
        ["--rules-only", " , "],
    ],
)
def test_bad_flag_values_exit_2(no_work: None, tmp_path: Path, extra: list[str]) -> None:
    assert cli.main(["optimize", str(SMALL_CNN), "-o", str(tmp_path / "out.onnx"), *extra]) == 2
    assert not (tmp_path / "out.onnx").exists()


def test_output_required_exactly_once(
    no_work: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["optimize", str(SMALL_CNN)]) == 2
    assert "no output path" in capsys.readouterr().err
    argv = ["optimize", str(SMALL_CNN), str(tmp_path / "a.onnx"), "-o", str(tmp_path / "b.onnx")]
    assert cli.main(argv) == 2
    assert "not both" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------
# --input-shape


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("input:1,3,224,224", ("input", (1, 3, 224, 224))),
        ("x: 2 , 7", ("x", (2, 7))),
        ("ns:tensor:0:4", ("ns:tensor:0", (4,))),
    ],
)
def test_parse_input_shape(text: str, expected: tuple[str, tuple[int, ...]]) -> None:
    assert cli.parse_input_shape(text) == expected


@pytest.mark.parametrize(
    "text", ["input", "input:", ":1,2", "input:1,a", "input:1,,2", "input:0,3", "input:-1", "input:1.5"]
)
def test_input_shape_syntax_errors_exit_2(
    no_work: None, tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    with pytest.raises(ValueError):
        cli.parse_input_shape(text)
    assert (
        cli.main(["optimize", str(SMALL_CNN), "-o", str(tmp_path / "out.onnx"), "--input-shape", text]) == 2
    )
    err = capsys.readouterr().err
    assert "--input-shape" in err
    assert "Traceback" not in err
    assert not (tmp_path / "out.onnx").exists()


@pytest.mark.parametrize(
    ("shapes", "message"),
    [
        (["nosuch:1,2"], "not a graph input"),
        (["input:1,3,32"], "rank 4"),
        (["input:2,3,32,32"], "fixed to 1"),
        (["input:1,3,32,32", "input:1,3,32,33"], "given twice"),
    ],
)
def test_input_shape_that_does_not_fit_the_model_exits_2(
    fake: FakePipeline, tmp_path: Path, capsys: pytest.CaptureFixture[str], shapes: list[str], message: str
) -> None:
    argv = ["optimize", str(SMALL_CNN), "-o", str(tmp_path / "out.onnx")]
    for s in shapes:
        argv += ["--input-shape", s]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err
    assert_one_line_error(err)
    assert fake.calls == []
    assert not (tmp_path / "out.onnx").exists()


# ---------------------------------------------------------------------------------------------
# failing early, writing nothing


def test_missing_input_subprocess(tmp_path: Path) -> None:
    res = run_module(
        "optimize", tmp_path / "missing.onnx", "-o", tmp_path / "out.onnx", cwd=tmp_path, timeout=120
    )
    assert res.returncode == 2
    assert_one_line_error(res.stderr)
    assert "not found" in res.stderr
    assert res.stdout == ""
    assert list(tmp_path.iterdir()) == []


def test_missing_input_in_process(
    fake: FakePipeline, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["optimize", str(tmp_path / "missing.onnx"), "-o", str(tmp_path / "out.onnx")]) == 2
    captured = capsys.readouterr()
    assert_one_line_error(captured.err)
    assert captured.out == ""
    assert fake.calls == []
    assert list(tmp_path.iterdir()) == []


def test_garbage_input_exits_2(
    fake: FakePipeline, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"this is not a model\n" * 10)
    assert cli.main(["optimize", str(bad), "-o", str(tmp_path / "out.onnx")]) == 2
    assert_one_line_error(capsys.readouterr().err)
    assert fake.calls == []
    assert not (tmp_path / "out.onnx").exists()


def test_output_in_missing_directory_fails_before_any_work(
    no_work: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "no" / "such" / "dir" / "out.onnx"
    assert cli.main(["optimize", str(SMALL_CNN), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert_one_line_error(err)
    assert "does not exist" in err
    assert not out.parent.exists()


def test_output_in_missing_directory_subprocess(tmp_path: Path) -> None:
    out = tmp_path / "missing" / "out.onnx"
    res = run_module("optimize", SMALL_CNN, out, cwd=tmp_path, timeout=120)
    assert res.returncode == 2
    assert_one_line_error(res.stderr)
    assert res.stdout == ""
    assert list(tmp_path.iterdir()) == []


def test_report_json_in_missing_directory_fails_before_any_work(no_work: None, tmp_path: Path) -> None:
    argv = ["optimize", str(SMALL_CNN), "-o", str(tmp_path / "out.onnx")]
    assert cli.main([*argv, "--report-json", str(tmp_path / "missing" / "r.json")]) == 2
    assert list(tmp_path.iterdir()) == []


def test_output_must_not_be_the_input(no_work: None, tmp_path: Path) -> None:
    model = tmp_path / "m.onnx"
    model.write_bytes(SMALL_CNN.read_bytes())
    assert cli.main(["optimize", str(model), "-o", str(model)]) == 2
    assert model.read_bytes() == SMALL_CNN.read_bytes()


def test_report_json_must_not_be_the_output(no_work: None, tmp_path: Path) -> None:
    out = tmp_path / "out.onnx"
    assert cli.main(["optimize", str(SMALL_CNN), "-o", str(out), "--report-json", str(out)]) == 2
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (VerificationError("y", 0.5, "seed 0", ["some-rule"]), 3),
        (BadInputError("opset 99 is not supported"), 2),
    ],
)
def test_pipeline_errors_map_to_exit_codes_and_write_nothing(
    fake: FakePipeline, tmp_path: Path, capsys: pytest.CaptureFixture[str], error: Exception, code: int
) -> None:
    fake.raises = error
    out, report = tmp_path / "out.onnx", tmp_path / "report.json"
    assert cli.main(["optimize", str(SMALL_CNN), "-o", str(out), "--report-json", str(report)]) == code
    captured = capsys.readouterr()
    assert_one_line_error(captured.err)
    assert captured.err.startswith(f"onnxsat: error: {str(error).splitlines()[0]}")
    assert captured.out == ""
    assert list(tmp_path.iterdir()) == []


def test_internal_error_is_one_line_with_type(
    fake: FakePipeline, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake.raises = RuntimeError("e-class 42 has no shape\nsecond line")
    out = tmp_path / "out.onnx"
    assert cli.main(["optimize", str(SMALL_CNN), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert_one_line_error(err)
    assert "internal error" in err
    assert "RuntimeError: e-class 42 has no shape" in err
    assert "--debug" in err
    assert not out.exists()


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_reraises_internal_errors(fake: FakePipeline, tmp_path: Path, where: str) -> None:
    fake.raises = RuntimeError("boom")
    argv = ["optimize", str(SMALL_CNN), "-o", str(tmp_path / "out.onnx")]
    argv = ["--debug", *argv] if where == "before" else [*argv, "--debug"]
    with pytest.raises(RuntimeError, match="boom"):
        cli.main(argv)
    assert list(tmp_path.iterdir()) == []


def test_keyboard_interrupt_exits_130(
    fake: FakePipeline, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake.raises = KeyboardInterrupt()
    assert cli.main(["optimize", str(SMALL_CNN), "-o", str(tmp_path / "out.onnx")]) == 130
    assert "interrupted" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------
# what a successful run writes and prints (stand-in pipeline)


def test_success_writes_model_report_and_table(
    fake: FakePipeline, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, report = tmp_path / "out.onnx", tmp_path / "report.json"
    assert cli.main(["optimize", str(SMALL_CNN), str(out), "--report-json", str(report)]) == 0
    onnx.checker.check_model(onnx.load(str(out)))
    data = json.loads(report.read_text())
    assert data["verification"]["status"] == "passed"
    captured = capsys.readouterr()
    assert "onnxsat report" in captured.out
    assert str(out) in captured.out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.onnx", "report.json"]  # no temp files left


def test_json_prints_only_json(
    fake: FakePipeline, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["optimize", str(SMALL_CNN), "-o", str(tmp_path / "out.onnx"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["total_nodes_before"] == 6


def test_quiet_prints_nothing(fake: FakePipeline, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["optimize", str(SMALL_CNN), "-o", str(tmp_path / "out.onnx"), "--quiet"]) == 0
    assert capsys.readouterr().out == ""


def test_failed_verification_in_report_writes_nothing(
    monkeypatch: pytest.MonkeyPatch, fake: FakePipeline, tmp_path: Path
) -> None:
    original: Callable[..., tuple[onnx.ModelProto, Report]] = fake.optimize

    def optimize(model: onnx.ModelProto, options: Options | None = None) -> tuple[onnx.ModelProto, Report]:
        out, report = original(model, options)
        report.verification = VerificationSummary("failed", "output y differs")
        return out, report

    monkeypatch.setattr(sys.modules["onnxsat.pipeline"], "optimize", optimize)
    assert cli.main(["optimize", str(SMALL_CNN), "-o", str(tmp_path / "out.onnx")]) == 3
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------
# end to end with the real pipeline (needs onnxsat.pipeline)


def test_end_to_end_subprocess(tmp_path: Path) -> None:
    model = tmp_path / "small_cnn.onnx"
    model.write_bytes(SMALL_CNN.read_bytes())
    before = model.read_bytes()
    out, report = tmp_path / "small_cnn.opt.onnx", tmp_path / "report.json"
    res = run_module("optimize", model, "-o", out, "--report-json", report, *FAST, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    assert "onnxsat report" in res.stdout
    assert model.read_bytes() == before
    onnx.checker.check_model(onnx.load(str(out)), full_check=True)
    data = json.loads(report.read_text())
    assert data["verification"]["status"] == "passed"
    assert data["total_nodes_before"] == len(onnx.load(str(model)).graph.node)
    assert data["total_nodes_after"] == len(onnx.load(str(out)).graph.node)


def test_end_to_end_in_process(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = SMALL_CNN.read_bytes()
    out, report = tmp_path / "out.onnx", tmp_path / "report.json"
    argv = ["optimize", str(SMALL_CNN), str(out), "--report-json", str(report), "--json", *FAST]
    argv += ["--input-shape", "input:1,3,32,32"]
    assert cli.main(argv) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(report.read_text())
    assert printed["verification"]["status"] == "passed"
    assert SMALL_CNN.read_bytes() == before
    onnx.checker.check_model(onnx.load(str(out)))


def test_end_to_end_external_data(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out.onnx"
    assert cli.main(["optimize", str(SMALL_CNN), "-o", str(out), "--external-data", "--quiet", *FAST]) == 0
    assert capsys.readouterr().out == ""
    assert (tmp_path / "out.onnx.data").is_file()
    onnx.checker.check_model(str(out))
    loaded = onnx.load(str(out))
    shell = onnx.load(str(out), load_external_data=False)
    assert any(onnx.external_data_helper.uses_external_data(t) for t in shell.graph.initializer)
    assert len(loaded.graph.initializer) == len(shell.graph.initializer) > 0
