"""One callee table decides what every call does, and nothing unguarded reaches native code.

``fxloom.bytecode.callees`` lists what each callable does (recorded, inlined, pure C code, C
code that reads or changes outside state, a result that changes between calls, a break); a C
callable it does not list is a break, never assumed pure. A value whose type alone is guarded
(an object from outside, a numpy array Python made at a graph break, an iterator) never
reaches a native function or operator, whose result would be decided once, at capture.

Each case calls the compiled function several times, changing what it reads between calls,
and compares every call with eager.
"""

from __future__ import annotations

import builtins
import collections
import copy
import dataclasses
import enum
import functools
import itertools
import math
import os
import zlib

import numpy as np
import pytest
import torch

import fxloom
from fxloom.bytecode import callees

pytestmark = pytest.mark.usefixtures("one_thread")


def values(results) -> list:
    return [result.tolist() for result in results]


# ----------------------------------------------------------------------------- changing results
COUNTER = itertools.count()


def test_next_of_an_outside_counter_advances_at_every_call():
    global COUNTER

    def step(x):
        return x + next(COUNTER)

    COUNTER = itertools.count()
    eager = [step(torch.zeros(1)) for _ in range(4)]
    COUNTER = itertools.count()
    compiled = fxloom.compile(step)
    assert values(compiled(torch.zeros(1)) for _ in range(4)) == values(eager) == [[0.0], [1.0],
                                                                                   [2.0], [3.0]]  # fmt: skip


ITEMS = iter(())


def test_next_of_an_outside_iterator_advances_at_every_call():
    global ITEMS

    def step(x):
        return x + next(ITEMS)

    ITEMS = iter([10, 20, 30, 40])
    compiled = fxloom.compile(step)
    assert values(compiled(torch.zeros(1)) for _ in range(4)) == [[10.0], [20.0], [30.0], [40.0]]
    assert compiled.breaks[0].kind == "changing-result"


def test_next_of_an_iterator_the_program_makes_stays_in_the_graph():
    def first(x):
        return x + next(iter([3, 4]))

    compiled = fxloom.compile(first)
    assert values([compiled(torch.zeros(1)), compiled(torch.ones(1))]) == [[3.0], [4.0]]
    assert compiled.explain().break_count == 0


# ----------------------------------------------------------------------------- values from a break
def test_numpy_mean_of_a_tensor_is_computed_at_every_call():
    def scaled(x):
        return x * float(np.mean(x.numpy()))

    compiled = fxloom.compile(scaled)
    for x in (torch.zeros(3), torch.ones(3), torch.full((3,), 2.0), torch.ones(3)):
        assert torch.equal(compiled(x), scaled(x))


def test_numpy_tanh_through_from_numpy_is_computed_at_every_call():
    def squashed(x):
        return torch.from_numpy(np.tanh(x.numpy()))

    compiled = fxloom.compile(squashed)
    for x in (torch.zeros(2), torch.ones(2), torch.full((2,), -3.0)):
        assert torch.equal(compiled(x), squashed(x))


def test_as_tensor_of_a_numpy_product_is_computed_at_every_call():
    def doubled(x):
        return torch.as_tensor(x.numpy() * 2)

    compiled = fxloom.compile(doubled)
    for x in (torch.zeros(2), torch.ones(2), torch.arange(2.0)):
        assert torch.equal(compiled(x), doubled(x))


def test_a_numpy_array_made_at_a_break_is_unguarded_in_the_next_piece():
    def first_item(x):
        array = x.numpy()
        return x + float(array[0])

    compiled = fxloom.compile(first_item)
    for x in (torch.zeros(2), torch.ones(2)):
        assert torch.equal(compiled(x), first_item(x))
    kinds = {stop.kind for stop in compiled.breaks}
    assert "tensor-data" in kinds


# ----------------------------------------------------------------------------- outside state
class Mode(enum.Enum):
    ADD = 1
    SUBTRACT = 2


MODE = Mode.ADD


def test_an_outside_enum_setting_changed_between_calls():
    global MODE

    def apply(x):
        return x + 1 if MODE is Mode.ADD else x - 1

    compiled = fxloom.compile(apply)
    MODE = Mode.ADD
    first = compiled(torch.zeros(1))
    MODE = Mode.SUBTRACT
    second = compiled(torch.zeros(1))
    MODE = Mode.ADD
    assert values([first, second]) == [[1.0], [-1.0]]


def test_an_enum_setting_that_does_not_change_compiles_once():
    def apply(x):
        return x * 2 if MODE == Mode.ADD else x

    compiled = fxloom.compile(apply)
    for _ in range(3):
        compiled(torch.ones(1))
    assert compiled.explain().graph_count == 1


ENABLED = {1, 2}


def test_membership_of_an_outside_set_changed_between_calls():
    def gated(x):
        return x + (1 if 3 in ENABLED else 0)

    compiled = fxloom.compile(gated)
    first = compiled(torch.zeros(1))
    ENABLED.add(3)
    second = compiled(torch.zeros(1))
    ENABLED.discard(3)
    third = compiled(torch.zeros(1))
    assert values([first, second, third]) == [[0.0], [1.0], [0.0]]


@dataclasses.dataclass
class Config:
    scale: float = 2.0
    bias: float = 0.0


CONFIG = Config()


def with_config_scale(compiled, scales):
    """``compiled(ones)`` once per scale, with ``CONFIG.scale`` set to it before the call."""
    results = []
    for scale in scales:
        CONFIG.scale = scale
        results.append(compiled(torch.ones(1)))
    CONFIG.scale = 2.0
    return values(results)


def test_a_config_read_through_dataclasses_asdict_changed_between_calls():
    def scaled(x):
        settings = dataclasses.asdict(CONFIG)
        return x * settings["scale"] + settings["bias"]

    assert with_config_scale(fxloom.compile(scaled), (2.0, 5.0, 2.0)) == [[2.0], [5.0], [2.0]]


def test_a_config_read_through_copy_copy_changed_between_calls():
    def scaled(x):
        return x * copy.copy(CONFIG).scale

    assert with_config_scale(fxloom.compile(scaled), (2.0, 7.0, 3.0)) == [[2.0], [7.0], [3.0]]


RECENT = collections.deque(maxlen=3)


def test_len_of_an_outside_bounded_deque_changed_between_calls():
    def count(x):
        return x + len(RECENT)

    RECENT.clear()
    compiled = fxloom.compile(count)
    results = []
    for step in range(5):
        results.append(compiled(torch.zeros(1)))
        RECENT.append(step)
    assert values(results) == [[0.0], [1.0], [2.0], [3.0], [3.0]]


def test_the_truth_of_an_outside_deque_changed_between_calls():
    def any_recent(x):
        return x + 1 if RECENT else x

    RECENT.clear()
    compiled = fxloom.compile(any_recent)
    first = compiled(torch.zeros(1))
    RECENT.append(1)
    second = compiled(torch.zeros(1))
    RECENT.clear()
    assert values([first, second]) == [[0.0], [1.0]]


def test_a_loop_over_an_outside_deque_sees_its_items_at_every_call():
    def total(x):
        for item in RECENT:
            x = x + item
        return x

    RECENT.clear()
    compiled = fxloom.compile(total)
    results = []
    for step in (1, 2, 3):
        RECENT.append(step)
        results.append(compiled(torch.zeros(1)))
    RECENT.clear()
    assert values(results) == [[1.0], [3.0], [6.0]]


class Holder:
    pass


HOLDER = Holder()


def test_hasattr_and_getattr_with_a_default_on_an_outside_object_changed_between_calls():
    def offset(x):
        if hasattr(HOLDER, "offset"):
            return x + getattr(HOLDER, "offset", 0)
        return x + getattr(HOLDER, "fallback", -1)

    compiled = fxloom.compile(offset)
    first = compiled(torch.zeros(1))
    HOLDER.offset = 4
    second = compiled(torch.zeros(1))
    HOLDER.offset = 6
    third = compiled(torch.zeros(1))
    del HOLDER.offset
    assert values([first, second, third]) == [[-1.0], [4.0], [6.0]]


def test_a_parameter_whose_data_is_replaced_with_another_shape_is_seen():
    class Scaled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(3))

        def forward(self, x):
            return x * self.weight.numel()

    model = Scaled()
    compiled = fxloom.compile(model)
    first = compiled(torch.ones(1))
    with torch.no_grad():
        model.weight.data = torch.ones(5)
    second = compiled(torch.ones(1))
    assert values([first, second]) == [[3.0], [5.0]]


def test_a_stand_in_never_reaches_a_class_level_list():
    class Recorder:
        seen: list = []

        def __call__(self, x):
            type(self).seen.append(x)
            Recorder.seen.append(x + 1)
            return x * 2

    recorder = Recorder()
    compiled = fxloom.compile(recorder.__call__)
    results = [compiled(torch.full((1,), float(step))) for step in range(3)]
    assert values(results) == [[0.0], [2.0], [4.0]]
    assert all(type(item) is torch.Tensor for item in Recorder.seen)
    assert values(Recorder.seen) == [[0.0], [1.0], [1.0], [2.0], [2.0], [3.0]]


def test_a_default_list_argument_changed_by_the_function_grows_at_every_call():
    def accumulate(x, seen=[]):  # noqa: B006 - the behaviour under test
        seen.append(1)
        return x + len(seen)

    compiled = fxloom.compile(accumulate)
    assert values(compiled(torch.zeros(1)) for _ in range(3)) == [[1.0], [2.0], [3.0]]


WEIGHTS = {"a": 3, "b": 1, "c": 2}


def test_sorted_max_and_reduce_with_python_keys_see_outside_state_at_every_call():
    def ranked(x):
        order = sorted(WEIGHTS, key=lambda name: WEIGHTS[name])
        best = max(WEIGHTS, key=WEIGHTS.get)
        total = functools.reduce(lambda total, name: total + WEIGHTS[name], WEIGHTS, 0)
        return x + ord(order[0]) * 100 + total * 10 + ord(best)

    compiled = fxloom.compile(ranked)
    results, expected = [], []
    for weight in (1, 10, 1):
        WEIGHTS["b"] = weight
        results.append(compiled(torch.zeros(1)))
        expected.append(ranked(torch.zeros(1)))
    WEIGHTS["b"] = 1
    assert values(results) == values(expected)
    assert compiled.explain().break_count == 0


def test_an_environment_variable_read_through_os_environ_get_changed_between_calls(monkeypatch):
    def flagged(x):
        return x + (1 if os.environ.get("FXLOOM_TEST_FLAG") == "1" else 0)

    monkeypatch.delenv("FXLOOM_TEST_FLAG", raising=False)
    compiled = fxloom.compile(flagged)
    first = compiled(torch.zeros(1))
    monkeypatch.setenv("FXLOOM_TEST_FLAG", "1")
    second = compiled(torch.zeros(1))
    assert values([first, second]) == [[0.0], [1.0]]
    assert compiled.explain().break_count == 0


def test_map_with_a_python_function_runs_as_python_rather_than_unseen():
    def doubled(x):
        return x + sum(map(lambda value: value * SCALE[0], [1, 2]))

    compiled = fxloom.compile(doubled)
    first = compiled(torch.zeros(1))
    SCALE[0] = 3
    second = compiled(torch.zeros(1))
    SCALE[0] = 1
    assert values([first, second]) == [[3.0], [9.0]]


SCALE = [1]


def test_setattr_on_an_outside_object_is_an_attribute_assignment_replayed_each_call():
    target = Holder()

    def mark(x):
        setattr(target, "calls", getattr(target, "calls", 0) + 1)  # noqa: B010 - under test
        return x + 1

    compiled = fxloom.compile(mark)
    for _ in range(3):
        compiled(torch.zeros(1))
    assert target.calls == 3


def test_a_lock_taken_around_library_code_is_not_held_after_a_capture():
    import threading

    lock = threading.Lock()

    def guarded(x):
        with lock:
            y = x + 1
        return y * float(y.sum())  # a break after the lock was released

    compiled = fxloom.compile(guarded)
    for value in (0.0, 1.0):
        assert torch.equal(compiled(torch.full((1,), value)), guarded(torch.full((1,), value)))
    assert not lock.locked()


# ----------------------------------------------------------------------------- default deny
def test_an_unlisted_c_function_breaks_naming_it_and_the_fix(monkeypatch):
    monkeypatch.setattr(callees, "_CLASSIFIED", {})

    def checksum(x):
        return x + zlib.crc32(b"fxloom") % 7

    compiled = fxloom.compile(checksum)
    assert torch.equal(compiled(torch.zeros(1)), checksum(torch.zeros(1)))
    (stop,) = compiled.breaks
    assert stop.kind == "unknown-callable"
    assert "crc32" in stop.detail and 'fxloom.bytecode.classify(crc32, "native_pure")' in str(stop)


def test_a_classified_c_function_is_folded_into_the_graph(monkeypatch):
    monkeypatch.setattr(callees, "_CLASSIFIED", {})
    fxloom.bytecode.classify(zlib.crc32, "native_pure")

    def checksum(x):
        return x + zlib.crc32(b"fxloom") % 7

    compiled = fxloom.compile(checksum)
    assert torch.equal(compiled(torch.zeros(1)), checksum(torch.zeros(1)))
    assert compiled.explain().break_count == 0


def test_an_unlisted_numpy_ufunc_breaks(monkeypatch):
    monkeypatch.setattr(callees, "_CLASSIFIED", {})
    assert callees.lookup(np.spacing) is None

    def spaced(x):
        return x + float(np.spacing(1.0))

    compiled = fxloom.compile(spaced)
    assert torch.equal(compiled(torch.zeros(1)), spaced(torch.zeros(1)))
    assert [stop.kind for stop in compiled.breaks] == ["unknown-callable"]


def test_a_listed_numpy_function_on_constants_is_folded():
    def shifted(x):
        return x + float(np.sqrt(4.0))

    compiled = fxloom.compile(shifted)
    assert torch.equal(compiled(torch.zeros(1)), torch.full((1,), 2.0))
    assert compiled.explain().break_count == 0


def test_classify_refuses_an_unknown_kind():
    with pytest.raises(ValueError, match="no callee kind 'pure'"):
        fxloom.bytecode.classify(zlib.adler32, "pure")


# ----------------------------------------------------------------------------- the table itself
def test_every_row_names_a_known_kind():
    for key, row in callees.rows().items():
        assert row.kind in callees.KINDS, key


def test_every_builtin_callable_has_a_row():
    missing = [
        name
        for name, value in vars(builtins).items()
        if callable(value) and callees.lookup(value) is None
    ]
    assert not missing


def test_every_public_math_function_is_pure():
    for name in dir(math):
        value = getattr(math, name)
        if callable(value) and not name.startswith("_"):
            assert callees.lookup(value).kind == "native_pure", name


@pytest.mark.parametrize("kind", [list, dict, set, collections.deque, str, tuple, int, float])
def test_every_public_method_of_a_builtin_container_or_value_has_a_row(kind):
    missing = [
        name
        for name in dir(kind)
        if not name.startswith("_") and callable(getattr(kind, name))
        if callees.method_row(kind, name) is None
    ]
    assert not missing


def test_methods_that_change_a_container_are_mutating_rows():
    for kind, name in ((list, "append"), (dict, "update"), (set, "add"),
                       (collections.deque, "appendleft"), (dict, "__setitem__")):  # fmt: skip
        assert callees.method_row(kind, name).kind == "native_mutating", (kind, name)


def test_calls_whose_result_changes_are_changing_result_rows():
    import random
    import time
    import uuid

    for fn in (time.time, time.perf_counter, random.random, random.randint, uuid.uuid4, next, id):
        assert callees.lookup(fn).kind == "changing_result", fn


def test_tensor_methods_that_read_data_are_break_rows():
    for name in ("item", "tolist", "__bool__", "numpy"):
        assert callees.tensor_method(name).kind == "break", name
    assert callees.tensor_method("add").kind == "record"
