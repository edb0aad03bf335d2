"""Changes to objects from outside the compiled function: shadowed during capture, replayed
after the graph.

A program that appends to a global list, sets an item of a dict it was passed, bumps a
``global`` or ``nonlocal`` counter or assigns an attribute of a class changes objects its
caller sees. Capture cannot leave them changed (the compile-time call is not the program's
call; the graph runs on every call), and cannot drop them. So ``Changes`` keeps them aside
while the interpreter runs -- the program reads back what it wrote -- and the compiled entry
replays them onto the real objects after its graph (``statements``), in one ordered log with
the program's deferred output, so that a ``print`` after an append shows the appended list:

=====================================  ===========================================  ===========
target (from outside the call)         replayed after the graph                     mode
=====================================  ===========================================  ===========
``list`` read by the program           ``T[:] = [...]``                             final state
``dict`` read by the program           ``T.update({...})``; first ``T.clear()``     final state
                                       when a key went or the key order changed
attribute (instance or class), cell,   ``setattr(T, name, v)``, ``C[i].cell_contents  final state
global                                 = v``, ``G[name] = v``
a list or dict only written to         the logged calls, re-issued in order         program
(``LOG.append(x)``, ``D[k] = v``)      (``list.append(T, out[0])``)                 order
``set``, ``deque`` (with or without    the logged calls, re-issued in order         program
``maxlen``), ``OrderedDict``,                                                       order
subclasses of these
attribute of a class with its own      each ``setattr`` re-issued in order          program
``__setattr__`` or a setter                                                         order
=====================================  ===========================================  ===========

Final state is replayed only where the program's read of the object guarded its contents
(a list's length and items, a dict's keys: ``Recording.read``), so the state written is
the one the entry computed for every call it accepts. Elsewhere only *blind* operations are
accepted -- those whose result and success do not depend on what the object holds
(``append``, ``add``, ``discard``, ``d[k] = v``, ``update``, ``clear``) -- and re-issued in
program order, so an append log gets a type and identity guard, never a length guard, and
appending never recompiles. Any other change (a ``pop`` from a deque, ``del`` of an
``OrderedDict`` key, an item read back from a changed deque) is a break.

During capture the object the program holds (the real object, or the copy ``read`` made of a
list or dict holding tensors) is changed in place, so native code sees the change as it
would; ``close`` puts every real object back as it was before the entry's first call runs.
Replayed tensors are the graph's outputs (the emitter's expressions), never stand-ins.

When an op of the graph raises at run time, eager would have made the changes and output
that come before that op in the program, and none after it. So ``Changes`` keeps a second
log, ``steps``: every entry with its *position*, the number of graph nodes recorded before
it (``position``, given by the recording), and, for a final-state target, its state at each
position where it changed (one entry per target and position: the writes between two graph
nodes all happen or none does). If node ``k`` raises, the steps at positions ``<= k`` -- a
prefix of ``steps`` -- are what eager did; the entry replays them (``entry.py``).

Depends on ``fxloom.bytecode.breaks``, ``sources`` and the values layer.
"""

from __future__ import annotations

import collections
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fxloom.bytecode.breaks import Break
from fxloom.bytecode.sources import Source
from fxloom.values.stand_in import StandIn

__all__ = [
    "KINDS",
    "NOT_CHANGED",
    "Changes",
    "describe",
    "each_statements",
    "kind_of",
    "statements",
]

NOT_CHANGED = object()
FINAL, ORDER = "final state", "program order"

_LIST_BLIND = frozenset(("append", "extend", "clear", "__iadd__"))
_DICT_BLIND = frozenset(("__setitem__", "update", "clear", "__ior__"))
_SET_BLIND = frozenset(
    ("add", "discard", "update", "clear", "difference_update", "intersection_update",
     "symmetric_difference_update", "__ior__", "__isub__", "__iand__", "__ixor__")
)  # fmt: skip
_DEQUE_BLIND = frozenset(
    ("append", "appendleft", "extend", "extendleft", "clear", "rotate", "__iadd__")
)
# Methods that iterate their arguments: the items are listed when the call is made (replay
# re-issues the call on the list, not on an iterator already used up).
_ITERATES = frozenset(
    ("extend", "extendleft", "update", "difference_update", "intersection_update",
     "symmetric_difference_update", "__iadd__", "__ior__", "__isub__", "__iand__", "__ixor__")
)  # fmt: skip
# Methods that compare the items (a stand-in's ``==`` would be a tensor).
_COMPARES = frozenset(("sort", "remove", "index", "count", "__contains__"))
_LITERAL = (list, tuple, set, frozenset, dict)


@dataclass(frozen=True, slots=True)
class Kind:
    """How ``Changes`` handles one builtin container type: its state as a plain copy, how to
    put that state back, the statements of a final state (None: program order only), and
    its blind methods."""

    base: type
    snapshot: Callable[[Any], Any]
    restore: Callable[[Any, Any], None]
    final: Callable[[str, Any, Any, Callable[[Any], str]], list[str]] | None
    blind: frozenset[str]


def _restore_list(target: list, saved: list) -> None:
    target[:] = saved


def _restore_dict(target: dict, saved: list) -> None:
    target.clear()
    target.update(saved)


def _restore_set(target: set, saved: set) -> None:
    target.clear()
    target.update(saved)


def _restore_deque(target: collections.deque, saved: list) -> None:
    target.clear()
    target.extend(saved)


def _final_list(target: str, base: list, new: list, expr) -> list[str]:
    return [f"{target}[:] = [{', '.join(map(expr, new))}]"]


def _list_from(target: str, base: list, new: list, expr) -> list[str]:
    """``new`` from ``base``: the items appended, or those dropped from the end, where one
    list starts with the other (the same objects); else the whole list."""
    if len(new) >= len(base) and all(map(operator.is_, base, new)):
        added = new[len(base) :]
        return [f"{target}.extend([{', '.join(map(expr, added))}])"] if added else []
    if all(map(operator.is_, new, base)):
        return [f"del {target}[{len(new)}:]"]
    return _final_list(target, base, new, expr)


def _final_dict(target: str, base: list, new: list, expr) -> list[str]:
    """``update`` with the keys that are new or hold another object; first ``clear`` when a
    key went or the order changed (``update`` keeps the old keys in their places)."""
    old_keys = [key for key, _ in base]
    new_keys = [key for key, _ in new]
    kept = len(new_keys) >= len(old_keys) and all(map(_same_key, old_keys, new_keys))
    if not kept:
        pairs = new
        clear = [f"{target}.clear()"]
    else:
        old = dict(base)
        pairs = [(key, value) for key, value in new if old.get(key, NOT_CHANGED) is not value]
        clear = []
    if not pairs:
        return clear
    items = ", ".join(f"{expr(key)}: {expr(value)}" for key, value in pairs)
    return [*clear, f"{target}.update({{{items}}})"]


def _same_key(old: Any, new: Any) -> bool:
    """Whether two keys are one (by identity: a tensor key's ``==`` is a tensor), or equal
    plain values."""
    return old is new or (type(old) is type(new) and type(old) in (str, int) and old == new)


KINDS: dict[type, Kind] = {
    list: Kind(list, list, _restore_list, _final_list, _LIST_BLIND),
    dict: Kind(dict, lambda d: list(d.items()), _restore_dict, _final_dict, _DICT_BLIND),
    collections.OrderedDict: Kind(
        collections.OrderedDict, lambda d: list(d.items()), _restore_dict, None, _DICT_BLIND
    ),
    set: Kind(set, set, _restore_set, None, _SET_BLIND),
    collections.deque: Kind(collections.deque, list, _restore_deque, None, _DEQUE_BLIND),
}


def kind_of(value: Any) -> Kind | None:
    """The row for ``value``'s type, or for the builtin container it subclasses."""
    for klass in type(value).__mro__:
        kind = KINDS.get(klass)
        if kind is not None:
            return kind
    return None


class Shadow:
    """One outside container the program changed: ``target`` the real object, ``view`` the
    object the program holds and changes (``target``, or the copy reading made of it)."""

    __slots__ = ("target", "view", "source", "kind", "mode", "guarded", "base", "calls")

    def __init__(self, target: Any, view: Any, source: Source, kind: Kind, guarded: bool) -> None:
        self.target = target
        self.view = view
        self.source = source
        self.kind = kind
        self.guarded = guarded  # the program's read guarded the contents (length, keys)
        final = guarded and kind.final is not None and type(target) is kind.base
        self.mode = FINAL if final else ORDER
        self.base = kind.snapshot(view)  # the state replay starts from (final state only)
        self.calls: list[Call] = []


@dataclass(frozen=True, slots=True)
class Call:
    """``kind.base.name(view, *args, **kwargs)``, re-issued in program order."""

    shadow: Shadow
    name: str
    args: tuple
    kwargs: dict


@dataclass(frozen=True, slots=True)
class State:
    """The final-state statements of ``shadow`` for the state ``state``."""

    shadow: Shadow
    state: Any


@dataclass(frozen=True, slots=True)
class Store:
    """``target = value``: an attribute (``owner`` not None), a cell or a global."""

    source: Source | None
    owner: Any
    name: str
    value: Any


@dataclass(frozen=True, slots=True)
class Output:
    """Deferred Python output (``print``, logging, warnings)."""

    fn: Any
    args: tuple
    kwargs: dict


class _Open:
    """A final-state target's entry in ``Changes.steps`` that later writes at the same
    position still update: its state is taken when the entry closes."""

    __slots__ = ("shadow",)

    def __init__(self, shadow: Shadow) -> None:
        self.shadow = shadow


class _DeferredLog(list):
    """``Recording.deferred``: output appended here joins the ordered log."""

    def __init__(self, changes: Changes) -> None:
        super().__init__()
        self._changes = changes

    def append(self, entry: tuple) -> None:
        super().append(entry)
        self._changes.output(*entry)


class Changes:
    """The changes one capture made to outside objects; see the module docstring.
    ``source_of`` names where an outside object was read from (``Recording.source_of``)."""

    def __init__(
        self,
        source_of: Callable[[Any], Source | None],
        position: Callable[[], int] = lambda: 0,
    ) -> None:
        self._source_of = source_of
        self._position = position  # how many graph nodes are recorded so far
        self._shadows: dict[int, Shadow] = {}  # id(target) and id(view) -> shadow
        self._copies: dict[int, tuple[Any, Any]] = {}  # id(real) -> (real, the read copy)
        self._originals: dict[int, Any] = {}  # id(read copy) -> real
        self._saved: dict[int, tuple[Any, Kind, Any]] = {}  # real objects changed in place
        self._stores: dict[tuple, Store] = {}  # (kind, id, name) -> the last store
        self._dirty: dict[tuple, Any] = {}  # final-state targets changed since the last flush
        self.log: list[Call | State | Store | Output] = []
        # (position, entry): the log as the program made it, node by node (module docstring)
        self.steps: list[tuple[int, Call | State | Store | Output]] = []
        self._open: dict[tuple, int] = {}  # final-state key -> index of its open step
        self.deferred = _DeferredLog(self)

    def __bool__(self) -> bool:
        """Whether the program changed an outside object (output alone changes nothing)."""
        return bool(self._dirty) or any(type(entry) is not Output for entry in self.log)

    # ------------------------------------------------------------ reading back
    def copied(self, copy: Any, real: Any) -> None:
        """``read`` gave the program ``copy`` (holding stand-ins) for the list or dict
        ``real``: every later read of ``real`` gets the same copy, so a change made through
        one reference is seen through the others."""
        if copy is not real and type(real) in (list, dict):
            self._copies[id(real)] = (real, copy)
            self._originals[id(copy)] = real

    def program_object(self, value: Any, read: Callable[[Any], Any]) -> Any:
        """What the program already holds for the outside object ``value`` (its changed view,
        or the copy read made of it), or None. ``read`` reads ``value`` with guards (for an
        append log whose contents the program now reads)."""
        shadow = self._shadows.get(id(value))
        if shadow is not None:
            if shadow.target is value and shadow.mode is ORDER and not shadow.guarded:
                self._read_contents(shadow, read)
                if not shadow.guarded:
                    raise Break(
                        "outside-mutation",
                        f"{shadow.source.text} is read after the program changed it, and the "
                        f"contents of a {type(value).__name__} are not guarded",
                    )
            return shadow.view
        found = self._copies.get(id(value))
        return None if found is None else found[1]

    def view_of(self, value: Any) -> Any:
        """The program's view of ``value`` if it changed it already (nothing read), or None."""
        shadow = self._shadows.get(id(value))
        return None if shadow is None else shadow.view

    def item_read(self, container: Any) -> bool:
        """Whether an item of ``container`` is the program's own value (a changed list or
        dict whose contents were read). Raises ``Break`` for an item of a changed object
        whose contents no guard covers."""
        shadow = self._shadows.get(id(container))
        if shadow is None or shadow.view is not container:
            return False
        if shadow.mode is ORDER and not shadow.guarded:
            raise Break(
                "outside-mutation",
                f"{shadow.source.text} is read back after the program changed it, and its "
                f"contents are not guarded ({type(container).__name__})",
            )
        return True

    def _read_contents(self, shadow: Shadow, read: Callable[[Any], Any]) -> None:
        """A list or dict first only written to (``LOG.append``) and now read: its contents
        are read as at the call (guarded), the logged calls applied again on what the
        program holds, and from here on it replays its final state."""
        real, kind = shadow.target, shadow.kind
        if shadow.kind.final is None or type(real) is not kind.base:
            return  # a deque, set, ...: reads of them are guarded by their type only
        saved = self._saved.pop(id(real), None)
        if saved is not None:
            kind.restore(real, saved[2])
        del self._shadows[id(real)]
        view = read(real)
        if view is not real:
            self._originals[id(view)] = real
        else:
            self._save(real, kind)
        for call in shadow.calls:
            getattr(kind.base, call.name)(view, *call.args, **call.kwargs)
        shadow.view, shadow.guarded, shadow.mode = view, True, FINAL
        shadow.base = kind.snapshot(view)
        self._shadows[id(real)] = self._shadows[id(view)] = shadow

    # ------------------------------------------------------------ changing containers
    def write_only(self, value: Any, source: Source) -> bool:
        """Start an append log: ``value`` (a list, dict, set or deque reached by ``source``,
        not read yet) is only written to next. Returns False when it was read before."""
        if id(value) in self._shadows or id(value) in self._copies:
            return False
        kind = kind_of(value)
        shadow = Shadow(value, value, source, kind, guarded=False)
        self._shadows[id(value)] = shadow
        return True

    def call(self, target: Any, name: str, args: tuple, kwargs: dict) -> Any:
        """``target.name(*args, **kwargs)`` on an outside container: made on what the program
        holds, logged for replay; returns what the call returns."""
        shadow = self._shadow_of(target, name)
        kind = shadow.kind
        if name not in kind.blind and not shadow.guarded:
            raise Break(
                "outside-mutation",
                f"{type(target).__name__}.{name} on {shadow.source.text}: its result depends "
                f"on the contents, which fxloom does not guard for a {type(target).__name__}",
            )
        args = _listed_arguments(target, name, args)
        if name in _COMPARES and any(isinstance(item, StandIn) for item in shadow.view):
            raise Break("opaque-call", f"{type(target).__name__}.{name} compares tensors")
        if shadow.view is shadow.target:
            self._save(shadow.target, kind)
        key = ("shadow", id(shadow))
        if shadow.mode is FINAL:
            self._step_before_change(key)
        result = getattr(kind.base, name)(shadow.view, *args, **kwargs)
        if shadow.mode is FINAL:
            self._dirty[key] = shadow
            self._step_changed(key, _Open(shadow))
        else:
            call = Call(shadow, name, args, dict(kwargs))
            shadow.calls.append(call)
            self.log.append(call)
            self.steps.append((self._position(), call))
        return result

    def _shadow_of(self, target: Any, name: str) -> Shadow:
        shadow = self._shadows.get(id(target))
        if shadow is not None:
            return shadow
        kind = kind_of(target)
        source = self._source_of(target)
        if kind is None or source is None:
            where = source.text if source is not None else "an object reached by no source"
            raise Break(
                "outside-mutation",
                f"{type(target).__name__}.{name} changes {where}, which fxloom cannot replay",
            )
        if type(target) not in (list, dict):
            # Held by the program with contents no guard covers (a set, a deque): what it
            # reads of them after the change could not be right at the next call.
            raise Break(
                "outside-mutation",
                f"{type(target).__name__}.{name} changes {source.text}, whose contents are not "
                f"guarded; change it where it is loaded ({source.text}.{name}(...))",
            )
        real = self._originals.get(id(target), target)
        shadow = Shadow(real, target, source, kind, guarded=type(target) in (list, dict))
        self._shadows[id(real)] = self._shadows[id(target)] = shadow
        return shadow

    def _save(self, real: Any, kind: Kind) -> None:
        if id(real) not in self._saved:
            self._saved[id(real)] = (real, kind, kind.snapshot(real))

    # ------------------------------------------------------------ stores
    def store(self, source: Source | None, owner: Any, name: str, value: Any,
              key: tuple, ordered: bool = False) -> None:  # fmt: skip
        """``target = value`` (an attribute of ``owner``, or the cell or global at
        ``source``), keyed by ``key``: the final value replayed, or (``ordered``: a setter
        of the program's own) every store in order."""
        store = Store(source, owner, name, value)
        self._stores[key] = store
        if ordered:
            self.log.append(store)
            self.steps.append((self._position(), store))
        else:
            self._dirty[key] = store
            self._step_before_change(key)
            self._step_changed(key, store)

    def stored_at_sources(self) -> list[tuple[Source, Any]]:
        """(source, the value last stored there) of each global and outside cell the
        program assigned (``global n; n += 1``)."""
        return [
            (store.source, store.value)
            for key, store in self._stores.items()
            if key[0] in ("global", "cell") and store.source is not None
        ]

    def stored(self, key: tuple) -> Any:
        """The value last stored at ``key`` during capture, or ``NOT_CHANGED``."""
        store = self._stores.get(key)
        return NOT_CHANGED if store is None else store.value

    # ------------------------------------------------------------ the ordered log
    def output(self, fn: Any, args: tuple, kwargs: dict) -> None:
        """Deferred output: what it shows was changed before it, so it follows the replay of
        those changes."""
        self._flush()
        output = Output(fn, tuple(args), dict(kwargs))
        self.log.append(output)
        self._close_steps()
        self.steps.append((self._position(), output))

    def _flush(self) -> None:
        for changed in self._dirty.values():
            if isinstance(changed, Store):
                self.log.append(changed)
            else:
                self.log.append(State(changed, changed.kind.snapshot(changed.view)))
        self._dirty.clear()

    def printed_storages(self) -> set[int]:
        """The storages of the tensors deferred output shows (``print(y)``): output runs after
        the graph, so a later in-place change to one of them would show in the text."""
        storages: set[int] = set()
        for entry in self.log:
            if type(entry) is Output:
                _collect_storages((entry.args, entry.kwargs), storages)
        return storages

    # ------------------------------------------------------------ steps (the graph raises)
    def _step_before_change(self, key: tuple) -> None:
        """Before a final-state target changes: its open step from an earlier position
        closes with the state it has now (what eager holds from there to this change)."""
        index = self._open.get(key)
        if index is not None and self.steps[index][0] != self._position():
            self._close_step(key)

    def _step_changed(self, key: tuple, entry: Store | _Open) -> None:
        """After a final-state target changed: its open step at this position holds the new
        state (one step per target and position), or a new step opens."""
        index = self._open.get(key)
        if index is None:
            self._open[key] = len(self.steps)
            self.steps.append((self._position(), entry))
        elif type(entry) is Store:
            self.steps[index] = (self.steps[index][0], entry)

    def _close_step(self, key: tuple) -> None:
        index = self._open.pop(key)
        position, entry = self.steps[index]
        if type(entry) is _Open:
            shadow = entry.shadow
            self.steps[index] = (position, State(shadow, shadow.kind.snapshot(shadow.view)))

    def _close_steps(self) -> None:
        """Output shows the states so far, and a later write must follow it: every open
        step closes."""
        for key in list(self._open):
            self._close_step(key)

    def close(self) -> None:
        """At the end of capture (or a break): the last states logged, and every real object
        changed in place put back as the call found it."""
        self._flush()
        self._close_steps()
        for real, kind, saved in self._saved.values():
            kind.restore(real, saved)
        self._saved.clear()


def _listed_arguments(target: Any, name: str, args: tuple) -> tuple:
    """The arguments as replay re-issues them: an iterable argument listed now (replay gets
    the items, not an iterator this call used up)."""
    if name not in _ITERATES:
        return args
    listed = []
    for arg in args:
        if isinstance(arg, StandIn):
            raise Break("opaque-call", f"{type(target).__name__}.{name} iterates a tensor")
        listed.append(arg if type(arg) in _LITERAL else list(arg))
    return tuple(listed)


def statements(log: list, expr: Callable[[Any], str], constant: Callable[[Any], str]) -> list[str]:
    """The Python statements that replay ``log`` after the graph: ``expr`` writes a value
    the program holds (stand-ins as graph outputs), ``constant`` names an object."""
    return [line for lines in each_statements(log, expr, constant) for line in lines]


def each_statements(
    log: list, expr: Callable[[Any], str], constant: Callable[[Any], str], steps: bool = False
):
    """The statements of each entry of ``log`` in turn (a list per entry; a final state is
    written relative to the state the entries before it leave). ``steps``: ``log`` is
    ``Changes.steps``, where a list appended to in a loop has a state per position: each is
    written as the items added or dropped at its end where it can be (not the whole list)."""
    bases: dict[int, Any] = {}  # id(shadow) -> the state the statements so far leave
    for entry in log:
        if type(entry) is State:
            shadow = entry.shadow
            base = bases.get(id(shadow), shadow.base)
            final = _list_from if steps and shadow.kind.final is _final_list else shadow.kind.final
            yield final(expr(shadow.view), base, entry.state, expr)
            bases[id(shadow)] = entry.state
        else:
            yield _STATEMENTS[type(entry)](entry, expr, constant)


def describe(entry: Call | State | Store | Output) -> str:
    """One entry of the log as the program wrote it, roughly (for notes on exceptions)."""
    kind = type(entry)
    if kind is Output:
        return f"{getattr(entry.fn, '__qualname__', entry.fn)}(...)"
    if kind is Call:
        return f"{entry.shadow.source.text}.{entry.name}(...)"
    if kind is State:
        return f"the new contents of {entry.shadow.source.text}"
    if entry.owner is not None:
        return f"{type(entry.owner).__name__}.{entry.name} = ..."
    return f"{entry.source.text} = ..."


def _call_statements(call: Call, expr, constant) -> list[str]:
    arguments = [expr(call.shadow.view), *map(expr, call.args)]
    arguments += [f"**{{{key!r}: {expr(value)}}}" for key, value in call.kwargs.items()]
    return [f"{constant(call.shadow.kind.base)}.{call.name}({', '.join(arguments)})"]


def _store_statements(store: Store, expr, constant) -> list[str]:
    if store.owner is not None:
        return [f"setattr({expr(store.owner)}, {store.name!r}, {expr(store.value)})"]
    return [f"{store.source.expr} = {expr(store.value)}"]


def _output_statements(output: Output, expr, constant) -> list[str]:
    arguments = [expr(arg) for arg in output.args]
    arguments += [f"**{{{key!r}: {expr(arg)}}}" for key, arg in output.kwargs.items()]
    return [f"{constant(output.fn)}({', '.join(arguments)})"]


_STATEMENTS = {
    Call: _call_statements,
    Store: _store_statements,
    Output: _output_statements,
}


def storage_key(stand_in: StandIn) -> int:
    """Which memory ``stand_in`` lives in: views of one tensor share it (their meta tensors
    share one storage, as the real tensors will)."""
    return stand_in._meta.untyped_storage()._cdata


def _collect_storages(value: Any, storages: set[int]) -> None:
    kind = type(value)
    if kind is StandIn:
        storages.add(storage_key(value))
    elif kind is tuple or kind is list:
        for item in value:
            _collect_storages(item, storages)
    elif kind is dict:
        for item in value.values():
            _collect_storages(item, storages)
