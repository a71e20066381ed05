"""passes/lowering/chain_order.py: a topological order that keeps producer -> consumer chains together."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from npuc.passes.lowering.chain_order import chain_order


@dataclass
class _Op:
    name: str
    inputs: list[str]
    outputs: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.outputs = self.outputs or [self.name]


def _names(ops: list[_Op]) -> list[str]:
    return [op.name for op in ops]


def test_interleaved_branches_become_chains() -> None:
    """YOLOv8's head as exported: the three branches' convs, then their sigmoids, then their multiplies."""
    ops = [_Op(f"conv{b}", ["x"]) for b in "abc"]
    ops += [_Op(f"sig{b}", [f"conv{b}"]) for b in "abc"]
    ops += [_Op(f"mul{b}", [f"conv{b}", f"sig{b}"]) for b in "abc"]
    assert _names(chain_order(ops)) == ["conva", "siga", "mula", "convb", "sigb", "mulb", "convc", "sigc", "mulc"]


def test_a_chained_order_comes_back_unchanged() -> None:
    ops = [_Op("a", ["x"]), _Op("b", ["a"]), _Op("c", ["b"]), _Op("d", ["a", "c"]), _Op("e", ["d"])]
    assert chain_order(ops) == ops


def test_an_op_waits_for_all_its_producers() -> None:
    """A residual add follows both branches, whichever the depth-first walk reaches first."""
    ops = [_Op("stem", ["x"]), _Op("down", ["stem"]), _Op("conv1", ["stem"]), _Op("conv2", ["conv1"]),
           _Op("add", ["down", "conv2"]), _Op("out", ["add"])]  # fmt: skip
    order = _names(chain_order(ops))
    assert order == ["stem", "down", "conv1", "conv2", "add", "out"]
    assert all(order.index(p) < order.index(op.name) for op in ops for p in op.inputs if p != "x")


def test_an_order_that_is_not_topological_is_refused() -> None:
    with pytest.raises(ValueError, match="not a topological order"):
        chain_order([_Op("a", ["b"]), _Op("b", ["a"])])
