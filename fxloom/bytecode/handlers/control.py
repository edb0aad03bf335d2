"""Handlers: jumps, truth tests and for loops.

A branch on a plain value is taken natively (its value was guarded when it was read); a
branch on a tensor needs its data, which capture does not have: a ``tensor-branch`` break.
"""

from __future__ import annotations

from typing import Any

import torch

from fxloom.bytecode.breaks import Break
from fxloom.bytecode.calls import record
from fxloom.bytecode.handlers.generators import is_lazy
from fxloom.bytecode.interpreter import handles
from fxloom.values.stand_in import DataDependentError, StandIn


def truth(value: Any, interp: Any = None) -> bool:
    if isinstance(value, StandIn):
        raise Break("tensor-branch", f"the truth of a tensor of shape {tuple(value.shape)}")
    try:
        result = bool(value)
    except DataDependentError as err:
        raise Break("tensor-data", str(err)) from None
    if interp is not None and not interp.native and interp.recording.is_unguarded(value):
        _guard_truth(interp.recording, value, result)
    return result


def _guard_truth(recording: Any, value: Any, result: bool) -> None:
    """The truth of an object guarded by its type alone: fixed by the type unless the type
    defines ``__bool__`` or ``__len__``; then ``bool(source)`` is guarded, or it breaks."""
    cls = type(value)
    if not (hasattr(cls, "__bool__") or hasattr(cls, "__len__")):
        return
    if not recording.guard_call(bool, (value,), result):
        raise Break("unguarded-value", f"the truth of a {cls.__qualname__} no guard can check")


@handles("JUMP")
def jump(interp, frame, instruction):
    frame.ip = instruction.target


@handles("POP_JUMP_IF_TRUE")
def pop_jump_if_true(interp, frame, instruction):
    if truth(frame.stack.pop(), interp):
        frame.ip = instruction.target


@handles("POP_JUMP_IF_FALSE")
def pop_jump_if_false(interp, frame, instruction):
    if not truth(frame.stack.pop(), interp):
        frame.ip = instruction.target


@handles("POP_JUMP_IF_NONE")
def pop_jump_if_none(interp, frame, instruction):
    if frame.stack.pop() is None:
        frame.ip = instruction.target


@handles("POP_JUMP_IF_NOT_NONE")
def pop_jump_if_not_none(interp, frame, instruction):
    if frame.stack.pop() is not None:
        frame.ip = instruction.target


@handles("JUMP_IF_TRUE_OR_POP")
def jump_if_true_or_pop(interp, frame, instruction):
    if truth(frame.stack[-1], interp):
        frame.ip = instruction.target
    else:
        frame.stack.pop()


@handles("JUMP_IF_FALSE_OR_POP")
def jump_if_false_or_pop(interp, frame, instruction):
    if not truth(frame.stack[-1], interp):
        frame.ip = instruction.target
    else:
        frame.stack.pop()


@handles("TO_BOOL")
def to_bool(interp, frame, instruction):
    frame.stack.append(truth(frame.stack.pop(), interp))


@handles("UNARY_NOT")
def unary_not(interp, frame, instruction):
    frame.stack.append(not truth(frame.stack.pop(), interp))


class ListIterator:
    """A for loop's iterator over items known when the loop starts (a list, a range, a
    dict's keys, ``enumerate``/``zip`` of such): the program's own, so a graph break inside
    the loop can hand the remaining items to the next piece (``LIST_ITER(items, position)``)."""

    __slots__ = ("items", "position")

    def __init__(self, items: list, position: int = 0) -> None:
        self.items = items
        self.position = position

    def __iter__(self) -> ListIterator:
        return self

    def __next__(self) -> Any:
        if self.position >= len(self.items):
            raise StopIteration
        self.position += 1
        return self.items[self.position - 1]


# Iterables whose items can be listed when the loop starts, without running user code.
_LISTED = (list, tuple, range, dict, str, bytes, set, frozenset, type({}.keys()),
           type({}.values()), type({}.items()), enumerate, zip, reversed,
           type(iter([])), type(iter(())), type(iter(range(0))))  # fmt: skip


@handles("GET_ITER")
def get_iter(interp, frame, instruction):
    value = frame.stack.pop()
    if interp.native:
        frame.stack.append(iter(value))
        return
    if isinstance(value, StandIn):  # iterating a tensor: its rows
        value = record(interp, "call_method", "unbind", (value, 0), {})
    elif isinstance(value, torch.nn.ModuleList | torch.nn.Sequential | torch.nn.ModuleDict):
        value = list(value)
    elif isinstance(value, ListIterator) or is_lazy(value):  # a generator expression: run
        frame.stack.append(value)  # one item per step, never listed ahead
        return
    elif interp.recording.is_unguarded(value):  # its items would be listed once, at capture
        raise Break(
            "unguarded-value",
            f"a for loop over a {type(value).__qualname__} whose items no guard checks",
        )
    elif _held_iterator(interp, value):
        raise Break("held-iterator", f"a for loop over a {type(value).__qualname__} held by name")
    elif not isinstance(value, _LISTED):
        # A Python iterable (a generator, a view class): its items listed by running it.
        graph = interp.recording.graph
        items = [graph.adopt(item) for item in value]
        if any(isinstance(item, StandIn) and graph.node_of(item) is None for item in items):
            raise Break(
                "generator", f"a for loop over a {type(value).__qualname__} that makes tensors"
            )
        frame.stack.append(interp.recording.built(ListIterator(items)))
        return
    items = list(value)
    graph = interp.recording.graph
    if any(isinstance(item, StandIn) and graph.node_of(item) is None for item in items):
        raise Break(
            "generator", f"a for loop over a {type(value).__qualname__} that iterates a tensor"
        )
    frame.stack.append(interp.recording.built(ListIterator(items)))


def _held_iterator(interp: Any, value: Any) -> bool:
    """Whether ``value`` is a one-shot iterator (``iter(it) is it``: a list's iterator, an
    ``enumerate``) that something besides this loop refers to: a variable or cell of an
    interpreted frame, or an object from outside. Listing its items at capture would use it
    up, where eager leaves the rest for whoever advances it after the loop (``next(it)``)."""
    if not hasattr(type(value), "__next__"):  # an iterable: each loop gets its own iterator
        return False
    if interp.recording.is_outside(value) or interp.recording.source_of(value) is not None:
        return True
    for frame in interp.frames:
        if any(held is value for held in frame.locals.values()):
            return True
        if any(_cell_holds(cell, value) for cell in frame.cells.values()):
            return True
    return False


def _cell_holds(cell: Any, value: Any) -> bool:
    try:
        return cell.cell_contents is value
    except ValueError:  # an empty cell
        return False


@handles("FOR_ITER")
def for_iter(interp, frame, instruction):
    iterator = frame.stack[-1]
    if not interp.native and id(iterator) not in interp.recording.created:
        # The loop's iterator came from the piece before a graph break: each step is taken
        # as Python, so one piece serves every iteration (guarded on the item it gets).
        raise Break("loop-step", "the next item of a for loop that a graph break interrupted")
    try:
        item = next(iterator)
    except StopIteration:
        frame.stack.pop()
        frame.ip = instruction.target
        return
    except DataDependentError as err:
        raise Break("tensor-data", str(err)) from None
    frame.stack.append(interp.recording.graph.adopt(item))


@handles("END_FOR")
def end_for(interp, frame, instruction):
    return None  # FOR_ITER's exit already popped the iterator and jumped past this
