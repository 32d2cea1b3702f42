"""Per-phase budgets: ``--phase-budget PHASE:KEY=VALUE,...`` and ``Budgets.phases`` give one schedule
phase its own limits; the report shows them next to the phase."""

from __future__ import annotations

import onnx
import pytest

import onnxsat
from onnxsat import cli
from onnxsat.base.errors import OnnxsatError
from onnxsat.base.options import Budgets, Options, PhaseBudget
from onnxsat.rules.schedule import default_schedule


def _options(*flags: str) -> Options:
    return cli.options_from_args(
        cli.build_parser().parse_args(["optimize", "in.onnx", "-o", "out.onnx", *flags])
    )


def test_flags_map_onto_budgets_and_later_keys_win() -> None:
    budgets = _options(
        "--phase-budget", "algebra:iterations=1,seconds=5",
        "--phase-budget", "fusion:iterations=0",
        "--phase-budget", "algebra:enodes=100,iterations=2",
        "--phase-budget", "plugin:my-family:seconds=0.5",
    ).budgets  # fmt: skip
    assert budgets.phases == (
        ("algebra", PhaseBudget(iterations=2, enodes=100, seconds=5.0)),
        ("fusion", PhaseBudget(iterations=0)),
        ("plugin:my-family", PhaseBudget(seconds=0.5)),
    )
    assert _options().budgets.phases == ()


@pytest.mark.parametrize(
    ("flag", "why"),
    [
        ("algebr:iterations=1", "unknown phase 'algebr'"),
        ("algebra:iters=1", "'iters=1' is not KEY=VALUE"),
        ("algebra:seconds=-1", "seconds"),
        ("algebra", "is not PHASE:KEY=VALUE"),
    ],
)
def test_bad_phase_budget_is_a_one_line_usage_error(
    flag: str, why: str, capsys: pytest.CaptureFixture[str], tmp_path: object
) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.build_parser().parse_args(["optimize", "in.onnx", "-o", "out.onnx", "--phase-budget", flag])
    assert exc.value.code == 2
    assert why in capsys.readouterr().err


def test_schedule_takes_each_phase_its_own_limits() -> None:
    budgets = Budgets(
        k_multi=1,
        phases=(("algebra", PhaseBudget(iterations=2, seconds=3.0)), ("multi", PhaseBudget(iterations=4))),
    )
    phases = {p.name: p for p in default_schedule(budgets)}
    assert (phases["algebra"].iterations, phases["algebra"].seconds, phases["algebra"].enodes) == (
        2,
        3.0,
        None,
    )
    assert phases["multi"].iterations == 4  # replaces k_multi
    assert phases["layout"].limits() == "" and phases["algebra"].limits() == "iterations=2,seconds=3"


def test_unknown_plugin_phase_is_an_options_error() -> None:
    model = onnx.load("examples/layout_algebra.onnx")
    options = Options(budgets=Budgets(phases=(("plugin:nope", PhaseBudget(iterations=1)),)))
    with pytest.raises(OnnxsatError, match="unknown phase 'plugin:nope'"):
        onnxsat.optimize(model, options)


def test_phase_limits_stop_the_phase_and_show_in_the_report() -> None:
    model = onnx.load("examples/layout_algebra.onnx")
    own = (
        ("algebra", PhaseBudget(iterations=1)),
        *((name, PhaseBudget(iterations=0)) for name in ("layout", "multi", "fusion")),  # a short run
    )
    _, report = onnxsat.optimize(model, Options(budgets=Budgets(phases=own), verify=False))
    algebra = [p for p in report.saturation.phases if p.name == "algebra"]
    assert len(algebra) == 2 and all(p.iterations <= 1 and p.limits == "iterations=1" for p in algebra)
    assert any(p.stop_reason == "iterations" for p in algebra)
    multi = next(p for p in report.saturation.phases if p.name == "multi")
    assert multi.iterations == 0 and multi.stop_reason == "no iterations"
    assert "algebra [iterations=1]" in report.render() and "multi [iterations=0]" in report.render()
    assert report.to_dict()["saturation"]["phases"][1]["limits"] == "iterations=1"
