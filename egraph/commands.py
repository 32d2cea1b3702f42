"""egglog commands built directly, for the import's thousands of actions.

Building an egglog expression through its Python layer costs ~0.2-0.5 ms (type inference and a
merge of the whole language's declarations on every call), so importing a 10,000-node graph
spent most of its time there. The import's actions are all of one flat kind (``union`` of a
tensor marker with an op term, ``set`` of an analysis value, a relation fact) over terms whose
argument types the op table already knows, so they are written here as egglog's own command
objects (``egglog.bindings``), one Rust object per term, and sent in batches.

Names come from the e-graph's state (``callable_ref_to_egg``, which also declares a function the
first time it is used), so the commands are exactly the ones egglog's Python layer would send
(``tests/test_commands.py`` compares the two on every op of the table). This reads egglog's
private ``_state`` and ``_run_program``, like ``egraph.run_cache``; egglog is pinned (``<14``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from egglog import EGraph, bindings

Term = Any
"""An egglog expression as a command object (``bindings.Call`` or ``bindings.Lit``)."""

_SPAN = bindings.RustSpan("", 0, 0)
BATCH = 2000
"""Commands per ``run_program`` call."""


def lit_int(value: int) -> Term:
    return bindings.Lit(_SPAN, bindings.Int(int(value)))


def lit_float(value: float) -> Term:
    return bindings.Lit(_SPAN, bindings.Float(float(value)))


def lit_string(value: str) -> Term:
    return bindings.Lit(_SPAN, bindings.String(str(value)))


def int_vec(values: Iterable[int]) -> Term:
    """A ``Vec[i64]`` literal (``vec-of``; ``vec-empty`` when empty, as egglog writes it)."""
    items = [lit_int(v) for v in values]
    return bindings.Call(_SPAN, "vec-of" if items else "vec-empty", items)


class Commands:
    """Terms and actions for one e-graph state: ``call`` builds a term of a language function,
    ``union``/``set``/``fact`` queue an action, ``send`` runs the queue."""

    def __init__(self, egraph: EGraph):
        self.egraph = egraph
        self._names: dict[Any, str] = {}
        self.queue: list[Any] = []

    def name(self, fn: Any) -> str:
        """The egg name of language callable ``fn`` (declared in the e-graph on first use)."""
        ref = fn.__egg_ref__
        known = self._names.get(ref)
        if known is None:
            self.egraph._add_decls(fn)
            known, reverse = self.egraph._state.callable_ref_to_egg(ref)
            assert not reverse, f"{known}: arguments egglog reverses are not built here"
            self._names[ref] = known
        return known

    def call(self, fn: Any, *args: Term) -> Term:
        return bindings.Call(_SPAN, self.name(fn), list(args))

    def union(self, left: Term, right: Term) -> None:
        self.queue.append(bindings.ActionCommand(bindings.Union(_SPAN, left, right)))

    def set(self, fn: Any, args: Sequence[Term], value: Term) -> None:
        self.queue.append(bindings.ActionCommand(bindings.Set(_SPAN, self.name(fn), list(args), value)))

    def fact(self, relation: Any, *args: Term) -> None:
        """Assert ``relation(args)`` (a relation is a function to Unit: an expression action)."""
        self.queue.append(bindings.ActionCommand(bindings.Expr_(_SPAN, self.call(relation, *args))))

    def send(self, between: Callable[[], None] | None = None) -> None:
        """Run the queued actions in batches (the queue is emptied), calling ``between`` before each:
        a time limit checked there stops a large import within a batch's time (egglog's run of one
        batch cannot be interrupted)."""
        queue, self.queue = self.queue, []
        for start in range(0, len(queue), BATCH):
            if between is not None:
                between()
            self.egraph._run_program(*queue[start : start + BATCH])

    def lookup(self, fn: Any, *args: Term) -> Any:
        """The value table ``fn`` holds for ``args`` (egglog's ``Value``), or None when it has none."""
        values = [self.egraph._egraph.eval_expr(arg)[1] for arg in args]
        return self.egraph._egraph.lookup_function(self.name(fn), values)
