"""fxloom.compile and changes to objects from outside the compiled function: replayed, not lost.

A program that appends to a global list, sets a dict item, adds to a set or a deque, assigns
an attribute of an object or a class, or bumps a ``global``/``nonlocal`` counter changes
objects its caller sees. Capture keeps those changes aside (later reads in the program see
them) and the compiled entry replays them onto the real objects after its graph
(``fxloom.bytecode.side_effects``).

Every case is a program with its own outside state, made twice (``make``): one copy runs
plainly, the other compiled, over several calls. After each call the results (or the
exceptions), the printed text and the outside objects must agree, and the outside objects
must hold real tensors, never fxloom's stand-ins; the number of cache entries is bounded.
"""

from __future__ import annotations

import collections
import copy
import types

import pytest
import torch

import fxloom
from fxloom.values.stand_in import StandIn

pytestmark = pytest.mark.usefixtures("one_thread")

# The outside state the programs below change: every copy of a program a test makes gets its
# own (``with_state``), so these module-level names are never changed themselves.
LOG = TABLE = CACHE = ORDER = SEEN = HISTORY = WINDOW = BOX = NUMBERS = ITEMS = N = None


# ----------------------------------------------------------------------------- helpers
def _equal(got, want) -> bool:
    if isinstance(want, torch.Tensor):
        return (
            type(got) is torch.Tensor
            and got.shape == want.shape
            and torch.allclose(got, want, atol=1e-6)
        )
    if isinstance(want, (list, tuple, collections.deque)):
        return (
            type(got) is type(want)
            and len(got) == len(want)
            and all(map(_equal, got, want))
            and getattr(got, "maxlen", None) == getattr(want, "maxlen", None)
        )
    if isinstance(want, dict):
        return (
            type(got) is type(want)
            and list(got) == list(want)  # the same keys, in the same order
            and all(_equal(got[k], want[k]) for k in want)
        )
    if hasattr(want, "__dict__") and not isinstance(want, type):  # objects: by their state
        return type(got) is type(want) and _equal(vars(got), vars(want))
    return type(got) is type(want) and got == want


def _no_stand_ins(value) -> bool:
    if isinstance(value, StandIn):
        return False
    if isinstance(value, (list, tuple, set, collections.deque)):
        return all(map(_no_stand_ins, value))
    if isinstance(value, dict):
        return all(map(_no_stand_ins, value.values()))
    if hasattr(value, "__dict__") and not isinstance(value, type):
        return _no_stand_ins(vars(value))
    return True


def with_state(fn, **state):
    """A maker of copies of ``fn``, each with its own deep copy of ``state`` as globals:
    ``make() -> (function, outside state)``."""

    def make():
        namespace = {**fn.__globals__, **copy.deepcopy(state)}
        made = types.FunctionType(fn.__code__, namespace, fn.__name__, fn.__defaults__)
        return made, lambda: {name: namespace[name] for name in state}

    return make


def _outcome(fn, args, capsys):
    try:
        result, error = fn(*args), None
    except Exception as raised:  # noqa: BLE001 - compared below
        result, error = None, raised
    return result, error, capsys.readouterr().out


def check_calls(make, calls, *, capsys, entries: int = 1):
    """Run the program ``make`` makes plainly and compiled on each of ``calls``; assert that
    each call agrees (result or exception, printed text, the outside state after it) and
    that the compiled one made at most ``entries`` cache entries (pieces included)."""
    plain, plain_state = make()
    program, compiled_state = make()
    compiled = fxloom.compile(program)
    for number, args in enumerate(calls):
        want, want_error, want_out = _outcome(plain, args, capsys)
        got, got_error, got_out = _outcome(compiled, args, capsys)
        where = f"call {number}"
        assert type(got_error) is type(want_error), (where, got_error, want_error)
        assert str(got_error) == str(want_error), where
        assert _equal(got, want), (where, got, want)
        assert got_out == want_out, where
        state = compiled_state()
        assert _no_stand_ins(state), (where, state)
        assert _equal(state, plain_state()), (where, state, plain_state())
    made = len(compiled.cache) + sum(map(len, compiled.pieces.values()))
    assert made <= entries, compiled.code
    return compiled


def tensors(count, size=3):
    return [(torch.arange(float(size)) + number,) for number in range(count)]


# ----------------------------------------------------------------------------- lists
def append_log(x):
    LOG.append(x * 2)
    return x + 1


def test_an_append_log_never_recompiles(capsys):
    compiled = check_calls(with_state(append_log, LOG=[]), tensors(10), capsys=capsys)
    assert len(compiled.cache) == 1
    assert "len(G['LOG'])" not in compiled.code  # identity and type, never the length


def test_an_append_log_that_holds_tensors_already_never_recompiles(capsys):
    make = with_state(append_log, LOG=[torch.zeros(3), torch.ones(3)])
    check_calls(make, tensors(5), capsys=capsys)


def append_then_count(x):
    LOG.append(x.sum())
    return x * len(LOG)


def test_a_length_read_after_an_append_sees_the_append(capsys):
    # The length is read, so it is guarded (each call has another): correct, recompiling.
    check_calls(with_state(append_then_count, LOG=[]), tensors(3), capsys=capsys, entries=3)


def insert_and_pop(x):
    ITEMS.insert(0, x * 2)
    last = ITEMS.pop()
    return last + x


def test_insert_and_pop_replay_the_final_list(capsys):
    make = with_state(insert_and_pop, ITEMS=[torch.zeros(3), torch.ones(3)])
    check_calls(make, tensors(3), capsys=capsys, entries=1)


def extend_in_place(x):
    global ITEMS
    ITEMS += [x, x * 3]
    return ITEMS[-1]


def test_an_in_place_add_to_an_outside_list(capsys):
    check_calls(with_state(extend_in_place, ITEMS=[]), tensors(3), capsys=capsys, entries=3)


# ----------------------------------------------------------------------------- dicts
def set_delete_pop(x, key):
    TABLE[key] = x * 2
    stale = TABLE.pop("stale", None)
    if "gone" in TABLE:
        del TABLE["gone"]
    return x + (0 if stale is None else stale)


def test_dict_items_set_deleted_and_popped(capsys):
    make = with_state(set_delete_pop, TABLE={"stale": 1.0, "gone": 2, "kept": 3})
    calls = [(x, key) for (x,), key in zip(tensors(4), "abab")]
    check_calls(make, calls, capsys=capsys, entries=4)


def cache_item(x, key):
    CACHE[key] = x * 2
    return x - 1


def test_a_dict_only_written_to_never_recompiles(capsys):
    calls = [(x, "k") for (x,) in tensors(5)]
    compiled = check_calls(with_state(cache_item, CACHE={}), calls, capsys=capsys)
    assert len(compiled.cache) == 1


def test_a_tensor_stored_into_an_outside_dict_is_the_graphs_real_tensor():
    cache = {}
    compiled = fxloom.compile(with_state(cache_item, CACHE=cache)()[0])
    program_state = compiled.fn.__globals__["CACHE"]
    x = torch.arange(3.0)
    compiled(x, "k")
    stored = program_state["k"]
    assert type(stored) is torch.Tensor and not isinstance(stored, StandIn)
    assert torch.equal(stored, x * 2)


def reorder(x):
    ORDER.pop("a")
    ORDER["a"] = x.sum()
    return x


def test_a_dict_whose_key_order_changed_is_rebuilt_in_order(capsys):
    make = with_state(reorder, ORDER={"a": 0, "b": 1})
    check_calls(make, tensors(3), capsys=capsys, entries=2)


# ----------------------------------------------------------------------------- sets, deques
def add_and_discard(x, n):
    SEEN.add(n)
    SEEN.discard(n - 2)
    return x * n


def test_a_set_added_to_and_discarded_from(capsys):
    make = with_state(add_and_discard, SEEN={0, 1})
    calls = [(x, n) for (x,), n in zip(tensors(5), range(5))]
    check_calls(make, calls, capsys=capsys, entries=5)


def deque_append(x):
    HISTORY.append(x.mean())
    return x * 2


def test_deque_appends_never_recompile(capsys):
    make = with_state(deque_append, HISTORY=collections.deque())
    compiled = check_calls(make, tensors(6), capsys=capsys)
    assert len(compiled.cache) == 1


def test_bounded_deque_appends_replay_in_program_order(capsys):
    make = with_state(deque_append, HISTORY=collections.deque(maxlen=2))
    check_calls(make, tensors(5), capsys=capsys)


def two_appends(x):
    WINDOW.append(x.sum())
    WINDOW.appendleft(x.max())
    return x


def test_bounded_deque_appends_at_both_ends(capsys):
    make = with_state(two_appends, WINDOW=collections.deque([0, 1], maxlen=2))
    check_calls(make, tensors(4), capsys=capsys)


# ----------------------------------------------------------------------------- attributes
class Holder:
    def __init__(self):
        self.last = None
        self.count = 0


def remember(x):
    BOX.last = x * 3
    return BOX.last + 1  # read back: the value just assigned


def test_an_instance_attribute_assigned_and_read_back(capsys):
    check_calls(with_state(remember, BOX=Holder()), tensors(4), capsys=capsys)


def count_calls(x):
    BOX.count = BOX.count + 1
    return x * BOX.count


def test_an_instance_counter(capsys):
    # The count is read, so guarded by value: each call recompiles (correct, not silent).
    check_calls(with_state(count_calls, BOX=Holder()), tensors(4), capsys=capsys, entries=4)


class Registry:
    seen: list = []


def register(x):
    Registry.seen.append(x * 2)
    return x


def test_a_class_level_list_append_holds_real_tensors(capsys):
    # torch issue #169253: appends to a class-level list dropped (or stand-ins leaked).
    Registry.seen = []
    plain_seen = []
    for (x,) in tensors(4):
        plain_seen.append(x * 2)
    compiled = fxloom.compile(register)
    for (x,) in tensors(4):
        assert torch.equal(compiled(x), x)
    assert _no_stand_ins(Registry.seen)
    assert _equal(Registry.seen, plain_seen)
    assert len(compiled.cache) == 1


class Settings:
    scale = 1.0


def set_class_attribute(x, scale):
    Settings.scale = scale
    return x * Settings.scale


def test_a_class_attribute_assigned(capsys):
    Settings.scale = 1.0
    compiled = fxloom.compile(set_class_attribute)
    for (x,), scale in zip(tensors(3), (2.0, 3.0, 2.0)):
        assert torch.allclose(compiled(x, scale), x * scale)
        assert Settings.scale == scale


class Child:
    pass


def replace_child(x):
    old = BOX.last
    BOX.last = Child()
    return old  # the old child, read before the replay assigns the new one


def test_a_value_read_before_its_attribute_is_replaced_stays_the_old_one(capsys):
    program, state = with_state(replace_child, BOX=Holder())()
    state()["BOX"].last = first = Child()
    compiled = fxloom.compile(program)
    assert compiled(torch.ones(1)) is first
    assert type(state()["BOX"].last) is Child and state()["BOX"].last is not first


# ----------------------------------------------------------------------------- cells, globals
def bump_global(x):
    global N
    N += 1
    return x * N


def test_a_global_counter(capsys):
    # N is read, so guarded by value: each call recompiles, correctly.
    check_calls(with_state(bump_global, N=0), tensors(4), capsys=capsys, entries=4)


def make_nonlocal_counter():
    count = 0

    def bump(x):
        nonlocal count
        count += 1
        return x * count

    return bump, lambda: count


def test_a_nonlocal_counter(capsys):
    check_calls(make_nonlocal_counter, tensors(4), capsys=capsys, entries=4)


def make_closure_list_changed_by_a_local_class():
    # torch issue #197896: a closure list changed by a method of a class defined in the call.
    items = []

    def f(x):
        class Collector:
            def add(self, value):
                items.append(value)

        Collector().add(x.sum())
        return x + 1

    return f, lambda: items


def test_a_closure_list_changed_by_a_method_of_a_class_made_in_the_call(capsys):
    check_calls(make_closure_list_changed_by_a_local_class, tensors(4), capsys=capsys, entries=8)


def make_closure_log():
    items = []

    def f(x):
        items.append(x * 2)
        return x

    return f, lambda: items


def test_a_closure_list_append_log(capsys):
    check_calls(make_closure_log, tensors(5), capsys=capsys)


# ----------------------------------------------------------------------------- order
def print_between_appends(x, n):
    NUMBERS.append(n)
    print("after the first append:", NUMBERS)
    NUMBERS.append(n * 10)
    print("after the second:", len(NUMBERS), NUMBERS)
    return x


def test_a_print_after_an_append_sees_the_appended_list(capsys):
    make = with_state(print_between_appends, NUMBERS=[])
    calls = [(x, n) for (x,), n in zip(tensors(3), range(3))]
    check_calls(make, calls, capsys=capsys, entries=3)


def print_appended_log(x):
    LOG.append(x * 2)
    print(LOG[-1])
    return x


def test_a_printed_tensor_just_appended_is_the_graphs_output(capsys):
    check_calls(with_state(print_appended_log, LOG=[]), tensors(3), capsys=capsys, entries=3)


def append_then_break(x):
    LOG.append(x * 2)
    scale = float(LOG[-1].sum())  # a graph break that reads what was just appended
    LOG.append(x * scale)
    return x * scale


def test_a_change_is_replayed_before_the_graph_break_runs(capsys):
    check_calls(with_state(append_then_break, LOG=[]), tensors(4), capsys=capsys, entries=12)


def append_then_maybe_raise(x, fail):
    LOG.append(x.sum())
    if fail:
        raise ValueError(f"failed after {len(LOG)} items")
    return x + 1


def test_an_exception_after_a_change_keeps_the_change(capsys):
    make = with_state(append_then_maybe_raise, LOG=[])
    calls = [(x, fail) for (x,), fail in zip(tensors(5), (False, True, False, True, False))]
    check_calls(make, calls, capsys=capsys, entries=16)


def append_items_in_a_loop(xs):
    for t in xs:
        LOG.append(t.sum().item())  # a break inside the loop: LOG.append crosses it
    return len(LOG)


def test_appends_in_a_loop_with_a_graph_break_happen_once_per_step(capsys):
    # The bound ``LOG.append`` the piece before the break hands on is LOG's own: replayed,
    # not run once while compiling (fxloom 0.x appended at compile time only).
    calls = [([torch.ones(2), torch.zeros(2)],)] * 4
    check_calls(with_state(append_items_in_a_loop, LOG=[]), calls, capsys=capsys, entries=8)


def append_twice(x):
    LOG.append(x.sum())
    LOG.append(x.max())  # loaded again to be changed: still no guard on its contents
    return x


def test_two_appends_to_one_log_never_recompile(capsys):
    compiled = check_calls(with_state(append_twice, LOG=[]), tensors(5), capsys=capsys)
    assert "len(G['LOG'])" not in compiled.code


# ----------------------------------------------------------------------------- left as breaks
def pop_from_deque(x):
    HISTORY.append(x.sum())
    return x * HISTORY.popleft()


def test_a_pop_from_a_deque_whose_contents_are_not_guarded_runs_as_python(capsys):
    # A deque's contents are guarded by its type only: a pop's result could be stale, so
    # that call is a break (run as Python), and the result stays right.
    make = with_state(pop_from_deque, HISTORY=collections.deque([torch.ones(3)]))
    check_calls(make, tensors(4), capsys=capsys, entries=8)


def add_through_a_local_name(x):
    seen = SEEN
    seen.add(x.shape[0])
    return x * len(seen)


def test_a_set_changed_through_a_local_name_runs_as_python(capsys):
    # Held under another name, its later reads (``len(seen)``) could not be guarded: a break.
    make = with_state(add_through_a_local_name, SEEN=set())
    check_calls(make, [(torch.ones(n),) for n in (1, 2, 2, 3)], capsys=capsys, entries=8)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 3)

    def forward(self, x):
        return self.fc(x).relu()


def hooked_model():
    features = []  # reached by the hook's closure only: no source to replay it through
    model = torch.nn.Sequential(Block(), Block())
    model[0].register_forward_hook(lambda module, args, out: features.append(out * 2))
    return model, features


def test_a_list_a_hook_closes_over_gets_real_tensors_at_every_call():
    # Changing it cannot be replayed, so that step runs as Python: never a stand-in leaked
    # into the user's list, never an append made only while compiling.
    model, features = hooked_model()
    plain_model, plain_features = hooked_model()
    plain_model.load_state_dict(model.state_dict())
    compiled = fxloom.compile(model)
    for (x,) in tensors(3):
        assert _equal(compiled(x[None]), plain_model(x[None]))
    assert _no_stand_ins(features)
    assert _equal(features, plain_features)


# ----------------------------------------------------------------------------- the recording
def _replayed(change) -> list[str]:
    """The statements a fresh recording replays after ``change(recording, view)`` on the list
    ``[1]`` read from the global ``LOG`` (which is back to ``[1]`` after capture)."""
    from fxloom.bytecode.recording import Recording
    from fxloom.bytecode.side_effects import statements
    from fxloom.bytecode.sources import Global

    outside = [1]
    recording = Recording()
    change(recording, recording.read(outside, Global("LOG")))
    recording.close_changes()
    assert outside == [1]
    named = {id(outside): "LOG"}  # the emitter writes an outside object by its source
    return statements(recording.changes.log, lambda value: named.get(id(value), repr(value)), repr)


def test_a_change_is_recorded_alike_as_a_bound_method_or_a_function_given_the_target():
    bound = _replayed(lambda recording, view: recording.mutate_outside(view, view.append, (2,), {}))
    unbound = _replayed(
        lambda recording, view: recording.mutate_outside(view, list.append, (view, 2), {})
    )
    assert bound == unbound == ["LOG[:] = [1, 2]"]


def test_operator_setitem_on_an_outside_list_is_replayed():
    import operator

    replayed = _replayed(
        lambda recording, view: recording.mutate_outside(view, operator.setitem, (view, 0, 5), {})
    )
    assert replayed == ["LOG[:] = [5]"]


def test_an_in_place_operator_given_the_outside_list_first_is_replayed():
    import operator

    def add_in_place(recording, view):
        assert recording.mutate_outside(view, operator.iadd, (view, [2]), {}) is view

    assert _replayed(add_in_place) == ["LOG[:] = [1, 2]"]


def make_class_with_a_body_that_prints():
    def f(x):
        class Collector:
            print("the class body runs")

        return x * 2

    return f, lambda: {}  # no outside state: the printed text is what is compared


def test_a_class_body_runs_at_every_call(capsys):
    check_calls(make_class_with_a_body_that_prints, tensors(3), capsys=capsys, entries=8)
