"""Rule verification: every rule of the library checked on instances of its own left-hand side.

Deliberately wrong rules registered here must fail with a counterexample, a rule whose guard
nothing satisfies must fail with the guard message, and ``onnxsat rules list|verify`` must list
and verify rules with the documented exit codes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from egglog import String, Vec, f64, i64, var, vars_

from onnxsat import cli
from onnxsat.egraph import lang as L
from onnxsat.egraph.ops import OPS
from onnxsat.rules import RULES
from onnxsat.rules.registry import RuleTable, rewrite_rule
from onnxsat.rules.verification.verify import RuleVerifier, describe_rule, verify_rule

KNOWN_UNSOUND: dict[str, str] = {}
"""Rules the verifier finds wrong today (strict xfail: remove an entry when its rule is fixed)."""


def _param(name: str) -> object:
    if name in KNOWN_UNSOUND:
        return pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=KNOWN_UNSOUND[name]))
    return name


@pytest.fixture(scope="module")
def verifier() -> RuleVerifier:
    """One e-graph for the whole library (the shape analysis is compiled once)."""
    return RuleVerifier()


@pytest.mark.parametrize("name", [_param(n) for n in RULES.names()])
def test_every_rule_verifies(verifier: RuleVerifier, name: str) -> None:
    result = verifier.verify(name)
    shown = result.counterexample.render() if result.counterexample else ""
    assert result.ok, f"{name}: {result.detail}\n{shown}"
    assert result.instances_fired >= 5
    assert all(n > 0 for n in result.variants_fired.values()), result.variants_fired


def test_every_op_can_be_instantiated() -> None:
    """``identity(op(...)) => op(...)`` for every op of the op table, all arguments variables: the
    samplers give each op valid instances (a rule over a new op fails here until it has a sampler)."""
    sorts = {"int": i64, "float": f64, "string": String, "ints": Vec[i64]}
    table = RuleTable()
    for spec in OPS.values():
        args = [var(f"in{i}", L.TList if n.endswith("*") else L.Tensor) for i, n in enumerate(spec.inputs)]
        args += [var(a.name, sorts[a.kind]) for a in spec.attrs] + (
            [var("index", i64)] if spec.indexed_outputs else []
        )
        rewrite_rule(table, "smoke", f"smoke-{spec.op_type}", L.identity(spec.ctor(*args)), spec.ctor(*args))
    verifier = RuleVerifier(table, seeds=1, max_candidates=64)
    failed = {r.name: r.detail for r in map(verifier.verify, table.names()) if not r.ok}
    assert not failed


# ---------------------------------------------------------------- rules that must fail
(x,) = vars_("x", L.Tensor)
p, q, s = vars_("p q s", Vec[i64])


@pytest.fixture
def bad_rule(request: pytest.FixtureRequest) -> Iterator[str]:
    name = request.param
    if name == "bad-relu-is-identity":
        # Wrong: relu(x) is not x (same shape: only numerics can tell).
        rewrite_rule(RULES, "test-bad", name, L.relu(x), x)
    elif name == "bad-transpose-compose":
        # Wrong unless p is the identity: the inner transpose is dropped.
        for r in range(1, 5):
            rewrite_rule(
                RULES,
                "test-bad",
                name,
                L.transpose(L.transpose(x, p), q),
                L.transpose(x, q),
                p.length() == i64(r),
                q.length() == i64(r),
                variant=str(r),
            )
    elif name == "bad-rotary-direction":
        # Wrong: concat(x[..., h:], -x[..., :h]) rotates the other way (rotate_half negates the upper half).
        cos, sin = vars_("cos sin", L.Tensor)
        halves = [
            L.slice_(x, L.Tensor.ints(start, i64(1)), L.Tensor.ints(end, i64(1)), L.Tensor.ints(Vec(i64(3)), i64(1)), L.Tensor.none())
            for start, end in ((p, q), (Vec(i64(0)), p))
        ]
        table = Vec(i64(1), i64(1), s[2], s[3])
        rewrite_rule(
            RULES,
            "test-bad",
            name,
            L.add(L.mul(x, cos), L.mul(L.concat(L.tlist([halves[0], L.neg(halves[1])]), i64(3)), sin)),
            L.fused_rotary(x, cos, sin, i64(11)),
            L.shape(x) == s,
            s.length() == i64(4),
            p.length() == i64(1),
            q.length() == i64(1),
            p[0] >= i64(1),
            s[3] == p[0] * i64(2),
            q[0] >= s[3],
            L.shape(cos) == table,
            L.shape(sin) == table,
            L.dtype(x) == i64(11),
        )
    else:
        # Right-hand side is fine, but no tensor has rank 2 and rank 3 at once.
        guards = (L.shape(x) == s, s.length() == i64(2), s.length() == i64(3))
        rewrite_rule(RULES, "test-bad", name, L.relu(x), L.relu(L.relu(x)), *guards)
    yield name
    RULES.remove(name)
    RULES.families.pop("test-bad", None)


@pytest.mark.parametrize("bad_rule", ["bad-relu-is-identity"], indirect=True)
def test_numerically_wrong_rule_fails_with_a_counterexample(bad_rule: str) -> None:
    result = verify_rule(bad_rule)
    assert not result.ok
    assert result.family == "test-bad"
    cex = result.counterexample
    assert cex is not None, result.detail
    assert cex.term_a.startswith("relu(") and cex.term_b == "x"
    assert cex.max_abs_err > 0 and cex.reason == "values differ"
    assert "x" in cex.leaves and "input f64" in cex.leaves["x"]


@pytest.mark.parametrize("bad_rule", ["bad-rotary-direction"], indirect=True)
def test_rotary_in_the_wrong_direction_fails(bad_rule: str) -> None:
    """The sampler reaches the rotate-half pattern (two complementary halves of one x, split in the
    middle of its last axis) and tells the two directions of rotation apart."""
    result = verify_rule(bad_rule)
    assert not result.ok
    assert result.counterexample is not None, result.detail
    assert result.counterexample.reason == "values differ"


@pytest.mark.parametrize("bad_rule", ["bad-transpose-compose"], indirect=True)
def test_subtly_wrong_rule_fails_on_a_non_identity_permutation(bad_rule: str) -> None:
    result = verify_rule(bad_rule)
    assert not result.ok
    cex = result.counterexample
    assert cex is not None, result.detail
    assert cex.instance.startswith("transpose(transpose(x, ")
    inner = cex.instance.split("transpose(x, ")[1].split("]")[0] + "]"
    perm = json.loads(inner)
    assert perm != sorted(perm), "an identity inner permutation makes the rule right"


@pytest.mark.parametrize("bad_rule", ["bad-unsatisfiable-guard"], indirect=True)
def test_unsatisfiable_guard_fails(bad_rule: str) -> None:
    result = verify_rule(bad_rule, max_candidates=64)
    assert not result.ok
    assert result.counterexample is None
    assert result.instances_fired == 0 and result.candidates == 64
    assert "guard never satisfied on generated instances" in result.detail


def test_description_comes_from_the_built_rule() -> None:
    info = describe_rule(RULES, "mul-one")
    assert info["family"] == "core"
    first = info["variants"][0]
    assert first["lhs"] == ["t := mul(x, Tensor.splat(1.0, sb, dt))"]
    assert first["rhs"] == ["t := x"]
    assert first["guards"] == ["shape(t) == sa", "shape(x) == sa"]


# ---------------------------------------------------------------- the command line
def test_cli_rules_list_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["rules", "list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == RULES.names()
    by_name = {r["name"]: r for r in rows}
    assert by_name["transpose-compose"]["family"] == "core"
    assert "pa.length() == i64(2)" in by_name["transpose-compose"]["variants"][1]["guards"]
    assert all(r["verification"] == {"status": "not run"} for r in rows)


def test_cli_rules_list_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["rules", "list"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["NAME", "FAMILY", "SOURCE", "RULES", "STATUS", "GUARDS"]
    assert "matmul-add-to-gemm" in out and "not run" in out


def test_cli_rules_verify_passing_rule(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["rules", "verify", "relu-relu", "--seeds", "2"]) == 0
    assert capsys.readouterr().out.startswith("PASS relu-relu [core]")


@pytest.mark.parametrize("bad_rule", ["bad-relu-is-identity"], indirect=True)
def test_cli_rules_verify_failing_rule(bad_rule: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["rules", "verify", bad_rule, "--json"]) == 1
    (row,) = json.loads(capsys.readouterr().out)
    assert row["name"] == bad_rule and row["ok"] is False
    assert row["counterexample"]["term_b"] == "x"


def test_cli_rules_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["rules", "verify", "no-such-rule"]) == 2
    assert "unknown rule or family 'no-such-rule'" in capsys.readouterr().err
    assert cli.main(["rules"]) == 2
    assert "usage: onnxsat rules" in capsys.readouterr().err
