"""The plugin API: everything a rule plugin imports from onnxsat (the rest is internal).

A plugin module defines ``PLUGIN = RulePlugin(...)``, adds rules with ``PLUGIN.rewrite`` (terms
of the tensor language ``lang``; ``ROOT`` names the matched term in guards), ``PLUGIN.rule`` or
``PLUGIN.ruleset``, and op rows with ``PLUGIN.op(OpSpec(...))``. A run uses it when its options
name it (``Options.rule_files``, or installed under the ``ENTRY_POINT_GROUP`` entry points);
``ensure_plugins`` loads and verifies plugins ahead of a run (tests). docs/plugins.md is the guide.
"""

from __future__ import annotations

from onnxsat.egraph import lang
from onnxsat.egraph.ops.registry import Attr, CostCtx, OpSpec, numel
from onnxsat.rules.plugins import (
    ENTRY_POINT_GROUP,
    PluginError,
    PluginLoad,
    PluginWarning,
    RulePlugin,
    ensure_plugins,
    unload_plugin,
)
from onnxsat.rules.registry import ROOT

__all__ = [
    "ENTRY_POINT_GROUP",
    "ROOT",
    "Attr",
    "CostCtx",
    "OpSpec",
    "PluginError",
    "PluginLoad",
    "PluginWarning",
    "RulePlugin",
    "ensure_plugins",
    "lang",
    "numel",
    "unload_plugin",
]
