"""Which ops of a model a target cannot run, all at once, before any calibration is spent.

A backend's per-op loop wraps each op in `per_op(op)`. In a normal build that is a no-op and the first
failing op stops the build with its error. Inside `collecting()` (what `npuc inspect MODEL --target T` runs),
a failing op's error is recorded and the loop goes on to the next op; `stop_if_gaps()` after the loop ends
the trial build there, before anything downstream trips over the missing ops.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from .errors import UserError
from .ir import Op


@dataclass(frozen=True)
class Gap:
    """One thing a target cannot run: an op (named), or the model as a whole (`op` is None)."""

    op: str | None
    kind: str | None
    reason: str
    after: tuple[str, ...] = ()  # judged failures upstream of it: its own may only follow from theirs
    judged: bool = True  # False: it failed only on a stand-in for a failed op's output (no verdict of its own)


class GapsFound(Exception):
    """Ends a trial build once its per-op loop has recorded every op it cannot run."""


class Gaps(list):
    """The gaps found so far, and which tensors the failed ops would have written (by tensor: the judged
    failures it descends from)."""

    def __init__(self) -> None:
        super().__init__()
        self.failed_outputs: dict[str, tuple[str, ...]] = {}


_found: ContextVar[Gaps | None] = ContextVar("npuc_coverage_gaps", default=None)


@contextmanager
def collecting() -> Iterator[Gaps]:
    """Record per-op failures instead of raising them; yields the list they go to."""
    gaps = Gaps()
    token = _found.set(gaps)
    try:
        yield gaps
    finally:
        _found.reset(token)


def in_trial() -> bool:
    """Whether this is a trial build (`npuc inspect --target`): its artifact is thrown away, so steps that only
    fill in values (not sizes or layouts) may take a cheap stand-in."""
    return _found.get() is not None


@contextmanager
def per_op(op: Op) -> Iterator[None]:
    """Around one op's lowering: raises as usual, or records the failure while collecting."""
    gaps = _found.get()
    if gaps is None:
        yield
        return
    after = tuple(dict.fromkeys(root for n in op.inputs for root in gaps.failed_outputs.get(n, ())))
    try:
        yield
    except UserError as exc:
        reason = str(exc)
        for prefix in (f"op '{op.name}' ({op.kind}): ", f"op '{op.name}' ({op.kind}) ", f"op '{op.name}': "):
            reason = reason.removeprefix(prefix)
        gaps.append(Gap(op.name, op.kind, reason, after))
        gaps.failed_outputs.update({name: (op.name,) for name in op.outputs})
    except Exception:
        if not gaps:  # nothing before it failed: a real defect, reported as one
            raise
        # after a failure the backend's state (its plans, its stand-ins) is not what a build would have
        roots = after or tuple(dict.fromkeys(g.op for g in gaps if g.judged and g.op))[:1]
        gaps.append(Gap(op.name, op.kind, "cannot be judged after the ops that failed", roots, judged=False))
        gaps.failed_outputs.update({name: roots for name in op.outputs})


def active() -> bool:
    """Whether a trial build is collecting (a backend may then stand in for a failed op's outputs, so the ops
    after it are judged on their own)."""
    return _found.get() is not None


def stop_if_gaps() -> None:
    """After a per-op loop: while collecting, end the trial build if any op failed."""
    gaps = _found.get()
    if gaps:
        raise GapsFound()
