"""``onnxsat rules list|verify``: the rule table, and the check of each rule egglog runs.

``rules list`` without plugins or ``--verify`` prints plain data from a checked cache
(``onnxsat.rules.listing``) and builds no egglog rule.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from typing import TYPE_CHECKING, Any

from onnxsat.base.errors import BadInputError
from onnxsat.cli_args import (
    EXIT_INTERNAL,
    EXIT_OK,
    EXIT_USAGE,
    PROG,
    add_plugin_flags,
    existing_files,
    int_arg,
    plugin_cache_dir,
)

if TYPE_CHECKING:
    from onnxsat.rules.registry import RuleTable

_RULES_EPILOG = """\
examples:
  onnxsat rules list
  onnxsat rules list --json --verify > rules.json
  onnxsat rules verify transpose-compose mul-one --seeds 5
  onnxsat rules verify core --json

exit status (verify, list --verify):
  0 every rule verified; 1 a rule failed (counterexample or guard never satisfied) or an
  internal error; 2 unknown rule or bad flag.
"""


def add_parser(sub: Any) -> None:
    """``onnxsat rules list|verify``: the rule table and the check of each rule egglog runs."""
    rules = sub.add_parser(
        "rules",
        help="list the rewrite rules, or verify them on generated instances",
        description=(
            "List every rewrite rule (name, family, guards), or verify rules: instances are built from\n"
            "each rule's own left-hand side with random small shapes, only that rule runs, and every\n"
            "term of the rewritten e-class is evaluated with onnx's numpy reference in float64."
        ),
        epilog=_RULES_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    rules.set_defaults(rules_parser=rules)
    actions = rules.add_subparsers(dest="rules_command", metavar="ACTION")
    lst = actions.add_parser("list", help="every rule with its family, guards and verification status")
    lst.add_argument(
        "--json", action="store_true", help="print the table as JSON (per egglog rule: lhs, rhs, guards)"
    )
    lst.add_argument(
        "--verify", action="store_true", help="verify every rule too (status is 'not run' without it)"
    )
    ver = actions.add_parser("verify", help="verify rules (all, or the named rules and families)")
    ver.add_argument("names", metavar="NAME", nargs="*", help="rule or family names (default: every rule)")
    ver.add_argument("--json", action="store_true", help="print the results as JSON")
    for action in (lst, ver):
        add_plugin_flags(action)
        action.add_argument(
            "--seeds",
            metavar="N",
            type=int_arg(1),
            default=3,
            help="random inputs per instance (default %(default)s)",
        )
        action.add_argument(
            "--min-instances",
            metavar="N",
            type=int_arg(1),
            default=5,
            help="instances a rule must fire on to pass (default %(default)s)",
        )
        action.add_argument(
            "--max-candidates",
            metavar="N",
            type=int_arg(1),
            default=300,
            help="instances generated per rule before giving up (default %(default)s)",
        )


def _expand_rule_names(names: list[str], table: RuleTable) -> list[str] | None:
    """Rule and family names of ``table`` -> rule names in table order (None: every rule)."""
    from onnxsat.rules.schedule import expand_rule_names

    if not names:
        return None
    try:
        chosen = expand_rule_names(names, table)
    except ValueError as exc:
        raise BadInputError(str(exc)) from exc
    return [n for n in table.names() if n in chosen]


def run(args: argparse.Namespace) -> int:
    import json

    from onnxsat.rules.listing import in_tree_rows, installed_plugins, rows_of

    if args.rules_command is None:
        args.rules_parser.print_help(sys.stderr)
        return EXIT_USAGE
    if args.rules_command == "list" and not (args.verify or args.rule_files or installed_plugins()):
        _print_rule_rows(in_tree_rows(plugin_cache_dir()), {}, args.json)  # plain data: no rule is built
        return EXIT_OK

    from onnxsat.rules.plugins import PluginWarning, ensure_plugins, plugin_ops, run_table
    from onnxsat.rules.verification.verify import verify_rules

    warnings.simplefilter("ignore", PluginWarning)  # printed below as one line each
    loads = ensure_plugins(
        existing_files(args.rule_files),
        entry_points=not args.no_plugins,
        strict=args.strict_plugins,
        cache_dir=plugin_cache_dir(),
    )
    for text in (t for load in loads for t in load.messages()):
        print(f"{PROG}: warning: {text}", file=sys.stderr)
    table = run_table(loads)
    if args.rules_command == "verify":
        names = _expand_rule_names(args.names, table)
    else:
        names = table.names()
    results = {}
    if args.rules_command == "verify" or args.verify:
        budget = {
            "seeds": args.seeds,
            "min_instances": args.min_instances,
            "max_candidates": args.max_candidates,
        }
        with plugin_ops(loads):
            results = {r.name: r for r in verify_rules(names, **budget, table=table)}
    if args.rules_command == "list":
        _print_rule_rows(rows_of(table), results, args.json)
    elif args.json:
        print(json.dumps([r.to_dict() for r in results.values()], indent=2))
    else:
        for r in results.values():
            head = f"PASS {r.name}" if r.ok else f"FAIL {r.name}"
            print(f"{head} [{r.family}]: {r.detail} ({r.candidates} candidates, {r.seconds:.1f}s)")
            if r.counterexample is not None:
                print("  " + r.counterexample.render())
    return EXIT_OK if all(r.ok for r in results.values()) else EXIT_INTERNAL


def _print_rule_rows(rows: list[dict[str, Any]], results: dict[str, Any], as_json: bool) -> None:
    """``onnxsat rules list``: each row with its verification (``results``: rule -> RuleVerification)."""
    import json

    for row in rows:
        r = results.get(row["name"])
        row["verification"] = r.to_dict() if r is not None else {"status": "not run"}
        if r is not None:
            row["verification"]["status"] = "verified" if r.ok else "failed"
    print(json.dumps(rows, indent=2) if as_json else _rules_table(rows))


def _rules_table(rows: list[dict[str, Any]]) -> str:
    """Name, family, egglog-rule count, status, and the first egglog rule's guards."""
    lines = [f"{'NAME':<28} {'FAMILY':<12} {'SOURCE':<12} {'RULES':>5}  {'STATUS':<10} GUARDS"]
    for row in rows:
        v = row["verification"]
        status = v["status"] if v["status"] != "verified" else f"ok ({v['instances_fired']})"
        guards = "; ".join(row["variants"][0]["guards"]) if row["variants"] else ""
        more = f"  (first of {len(row['variants'])})" if len(row["variants"]) > 1 else ""
        lines.append(
            f"{row['name']:<28} {row['family'] or '-':<12} {row['source']:<12} {len(row['variants']):>5}  {status:<10}"
            f" {guards or '-'}{more}"
        )
    return "\n".join(lines)
