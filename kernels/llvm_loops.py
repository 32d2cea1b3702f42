"""The loops every hand-built LLVM function uses, written once (llvmlite ``IRBuilder``).

``for_range`` is a counted loop over an i64 slot (a header that tests ``i < stop``, the body,
the increment); ``spin_while`` re-tests a condition after each back-off until it is false (a
thread waiting on counters other threads move). Both leave the builder in the block after the
loop; block names are the caller's, so the emitted IR reads like the hand-written loops did.
"""

from __future__ import annotations

from collections.abc import Callable

from llvmlite import ir

I64 = ir.IntType(64)


def for_range(
    b: ir.IRBuilder,
    slot: ir.Value,
    start: ir.Value,
    stop: ir.Value,
    step: ir.Value,
    body: Callable[[ir.Value], None],
    *,
    blocks: tuple[str, str, str],
    nsw: bool = True,
) -> None:
    """``for (slot = start; slot < stop; slot += step) body(i)`` (signed compare; ``i`` is the
    header's load of ``slot``). ``blocks``: names of the header, body and exit blocks; ``nsw``:
    the increment cannot overflow (lets LLVM widen and vectorize the induction variable)."""
    fn = b.function
    b.store(start, slot)
    header, block, exit_ = (fn.append_basic_block(name) for name in blocks)
    b.branch(header)
    b.position_at_end(header)
    i = b.load(slot, typ=I64)
    b.cbranch(b.icmp_signed("<", i, stop), block, exit_)
    b.position_at_end(block)
    body(i)
    b.store(b.add(b.load(slot, typ=I64), step, flags=["nsw"] if nsw else []), slot)
    b.branch(header)
    b.position_at_end(exit_)


def spin_while(
    b: ir.IRBuilder,
    condition: Callable[[], ir.Value],
    back_off: Callable[[], None],
    *,
    blocks: tuple[str, str, str],
) -> None:
    """``while condition(): back_off()``, the condition emitted in the loop's first block so it is
    re-read (atomically, by the caller's loads) on every round. ``blocks``: names of the test,
    back-off and exit blocks."""
    fn = b.function
    test, spin, done = (fn.append_basic_block(name) for name in blocks)
    b.branch(test)
    b.position_at_end(test)
    b.cbranch(condition(), spin, done)
    b.position_at_end(spin)
    back_off()
    b.branch(test)
    b.position_at_end(done)
