"""Rule plugins: discovery through the entry point, firing on a model, rejection of wrong rules."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
import sys
import textwrap
import tomllib
import warnings
from collections.abc import Iterator
from pathlib import Path

import onnx
import pytest

import onnxsat
from onnxsat import cli
from onnxsat.rules import RULES
from onnxsat.rules import plugins as P

EXAMPLE_PLUGIN = Path(__file__).resolve().parent.parent / "examples" / "plugin"
EXAMPLE_MODEL = EXAMPLE_PLUGIN / "onnxsat_soft_activations" / "soft_activations.onnx"

WRONG_PLUGIN = textwrap.dedent(
    '''
    """Three rules: one sound (egglog ruleset style), one numerically wrong, one missing a guard."""
    from egglog import Vec, i64, rewrite, ruleset, vars_

    from onnxsat.plugin import ROOT, RulePlugin
    from onnxsat.plugin import lang as L

    PLUGIN = RulePlugin("wrong-examples", family="wrong-examples")
    (x,) = vars_("x", L.Tensor)
    dims, xd = vars_("dims xd", Vec[i64])
    (dt,) = vars_("dt", i64)

    triple = ruleset(name="triple-neg")

    @triple.register
    def _(y: L.Tensor):
        yield rewrite(L.neg(L.neg(L.neg(y)))).to(L.neg(y))

    PLUGIN.ruleset(triple)
    # Wrong: Softsign is not tanh.
    PLUGIN.rewrite(
        "softsign-as-tanh",
        L.div(x, L.add(L.abs_(x), L.Tensor.splat(1.0, dims, dt))),
        L.tanh(x),
        L.shape(ROOT) == xd,
        L.shape(x) == xd,
    )
    # Missing guard: x + 0 is x only when the zero does not broadcast x to a larger shape.
    PLUGIN.rewrite("add-zero-unguarded", L.add(x, L.Tensor.splat(0.0, dims, dt)), x)
    '''
)


@pytest.fixture
def clean_plugins() -> Iterator[None]:
    """Every plugin a test loads is unloaded afterwards (loads are cached per process)."""
    before = set(P._LOADED)
    P._reset_entry_points()
    yield
    P._reset_entry_points()
    for source in set(P._LOADED) - before:
        P.unload_plugin(P._LOADED[source])
    assert not [n for n in RULES.names() if P.rule_source(n) != P.IN_TREE]


def _install_entry_point(site: Path) -> None:
    """What ``pip install examples/plugin`` leaves for importlib.metadata: a dist-info with its entry points."""
    project = tomllib.loads((EXAMPLE_PLUGIN / "pyproject.toml").read_text())["project"]
    info = site / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n"
    )
    group = project["entry-points"][P.ENTRY_POINT_GROUP]
    lines = [f"[{P.ENTRY_POINT_GROUP}]", *(f"{name} = {target}" for name, target in group.items())]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")


def test_entry_point_plugin_is_discovered_verified_and_fires(
    clean_plugins: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _install_entry_point(tmp_path)
    monkeypatch.syspath_prepend(str(EXAMPLE_PLUGIN))
    monkeypatch.syspath_prepend(str(tmp_path))
    model = onnx.load(str(EXAMPLE_MODEL))
    options = onnxsat.Options(
        rules_only=("soft-activations", "core"), plugin_cache_dir=str(tmp_path / "cache")
    )
    optimized, report = onnxsat.optimize(model, options)

    (load,) = P.ensure_plugins(cache_dir=tmp_path / "cache")
    assert load.source == "entry point soft-activations" and load.error is None
    assert load.accepted == ["softplus-fusion", "softsign-fusion"] and not load.rejected
    assert load.ops == ["Softplus", "Softsign"]
    table = P.run_table([load])
    assert P.rule_source("softplus-fusion", table) == "plugin soft-activations (entry point soft-activations)"
    assert table.family_of("softsign-fusion") == "soft-activations"
    assert "softsign-fusion" not in RULES.egg_rules  # the in-tree table is not changed by a plugin
    ops = [n.op_type for n in optimized.graph.node]
    assert sorted(ops) == ["MatMul", "MatMul", "Softplus", "Softsign"]
    assert report.saturation.rule_matches()["softplus-fusion"] >= 1
    assert report.verification.status == "passed"  # onnxruntime agrees with the original
    assert not report.warnings
    from onnxsat.base import disk_cache

    entry = disk_cache.read(tmp_path / "cache" / P.CACHE_FILE)  # checksummed JSON
    assert entry is not None
    cached = json.loads(entry)
    assert sorted(v["name"] for v in cached.values()) == ["softplus-fusion", "softsign-fusion"]


def test_wrong_plugin_rules_are_rejected_with_counterexamples(
    clean_plugins: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    plugin_file = tmp_path / "wrong_rules.py"
    plugin_file.write_text(WRONG_PLUGIN)
    cache = tmp_path / "onnxsat"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # the CLI caches under $XDG_CACHE_HOME/onnxsat
    code = cli.main(["rules", "list", "--json", "--rules", str(plugin_file)])
    out, err = capsys.readouterr()
    assert code == 0
    rows = {row["name"]: row for row in json.loads(out)}
    assert rows["triple-neg-1"]["source"] == f"plugin wrong-examples ({plugin_file.resolve()})"
    assert rows["neg-neg"]["source"] == "in-tree"
    assert "softsign-as-tanh" not in rows and "add-zero-unguarded" not in rows
    assert "rule softsign-as-tanh rejected: counterexample: values differ" in err
    assert "rule add-zero-unguarded rejected: counterexample: two shapes or dtypes" in err

    # The optimize run goes on without the rejected rules and says why in its report...
    (load,) = P.ensure_plugins([str(plugin_file)])
    model = onnx.load(str(EXAMPLE_MODEL))
    options = onnxsat.Options(
        rules_only=("wrong-examples",), rule_files=(str(plugin_file),), entry_point_plugins=False
    )
    _, report = onnxsat.optimize(model, options)
    assert any("softsign-as-tanh rejected" in w and "tanh(" in w for w in report.warnings)
    assert "softsign-as-tanh" not in report.saturation.rule_matches()
    # ... unless plugins are strict.
    with pytest.raises(P.PluginError, match="wrong-examples rule"):
        onnxsat.optimize(model, dataclasses.replace(options, strict_plugins=True))
    assert cli.main(["rules", "list", "--strict-plugins", "--rules", str(plugin_file)]) == 2

    # Verdicts are cached by rule text: a fresh load of the same rules does not run the verifier.
    P.unload_plugin(load)
    monkeypatch.setattr("onnxsat.rules.verification.verify.RuleVerifier", None)  # calling it would raise
    with pytest.warns(P.PluginWarning, match="softsign-as-tanh rejected"):
        again = P.ensure_plugins([str(plugin_file)], cache_dir=cache)
    assert again[0].accepted == ["triple-neg-1"]


def test_a_broken_plugin_is_a_warning_naming_it(clean_plugins: None, tmp_path: Path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text("import no_such_module_for_onnxsat\n")
    empty = tmp_path / "empty.py"
    empty.write_text("X = 1\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loads = P.ensure_plugins([str(broken), str(empty)], entry_points=False)
    messages = [str(w.message) for w in caught if issubclass(w.category, P.PluginWarning)]
    assert [load.error is not None for load in loads] == [True, True]
    assert f"plugin {broken.resolve()} not loaded: ModuleNotFoundError" in messages[0]
    assert "defines no PLUGIN" in messages[1]
    # a file the user named that does not exist is an error, not a warning
    with pytest.raises(P.PluginError, match="no such file"):
        P.ensure_plugins([str(tmp_path / "missing.py")], entry_points=False)
    assert cli.main(["rules", "list", "--strict-plugins", "--rules", str(broken)]) == 2


_FRESH_RUN = """
import hashlib, json, sys
import onnx
import onnxsat
options = onnxsat.Options(**json.loads(sys.argv[2]))
optimized, report = onnxsat.optimize(onnx.load(sys.argv[1]), options)
print(json.dumps([hashlib.sha256(optimized.SerializeToString(deterministic=True)).hexdigest(),
                  sorted(report.saturation.rule_matches()), report.warnings]))
"""


def _result(optimized: onnx.ModelProto, report: onnxsat.Report) -> list:
    digest = hashlib.sha256(optimized.SerializeToString(deterministic=True)).hexdigest()
    return [digest, sorted(report.saturation.rule_matches()), report.warnings]


def test_a_plugin_of_one_run_is_not_seen_by_the_next(clean_plugins: None, tmp_path: Path) -> None:
    """Two optimize calls in one process give what two fresh processes give: the first call's
    plugin (its rules and its op rows) is gone in the second."""
    plugin_file = str(EXAMPLE_PLUGIN / "onnxsat_soft_activations" / "__init__.py")
    with_plugin = {"rule_files": [plugin_file], "entry_point_plugins": False, "plugin_cache_dir": str(tmp_path)}
    without = {"entry_point_plugins": False, "plugin_cache_dir": str(tmp_path)}  # the fresh run reads the rules
    model = onnx.load(str(EXAMPLE_MODEL))
    first, first_report = onnxsat.optimize(model, onnxsat.Options(**with_plugin))
    second, second_report = onnxsat.optimize(model, onnxsat.Options(**without))
    assert "Softplus" in [n.op_type for n in first.graph.node]
    assert "Softplus" not in [n.op_type for n in second.graph.node]
    # The plugin's op rows are out of the op table too: its ops are unknown to a run without it.
    _, third_report = onnxsat.optimize(first, onnxsat.Options(**without))
    assert third_report.unknown_ops.get("Softplus") == 1

    def fresh(options: dict) -> list:
        out = subprocess.run(
            [sys.executable, "-c", _FRESH_RUN, str(EXAMPLE_MODEL), json.dumps(options)],
            capture_output=True,
            text=True,
            check=True,
            timeout=600,
        )
        return json.loads(out.stdout.splitlines()[-1])

    assert _result(first, first_report) == fresh(with_plugin)
    assert _result(second, second_report) == fresh(without)
