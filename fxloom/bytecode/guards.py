"""Guards: what a compiled entry assumed, checked by one generated Python function per entry.

While the interpreter runs a function on its first call, every value it consults from
outside the function (``fxloom.bytecode.sources``) adds a guard: a tensor's type, dtype,
device, ``requires_grad`` and sizes; a Python constant's value (an int or float seen to
change: its type, and what the program decided on it, ``GuardSet.number``); a module's, function's or
global's identity; a container's length or a dict's keys; the global state (grad mode,
inference mode, autocast, default dtype) in one check. Once the graph is recorded, how the
tensors read relate is guarded too (``Recording.guard_identities``): which are the same object
(``y is x``, ``x is not y``) and, where the graph writes, which share storage. ``GuardSet.compile`` turns them into
one straight-line function, cheapest checks first, which the cache calls before reusing the
entry::

    def guard(L_x, L_layer):
        try:
            if not (type(L_x) is K0 and type(L_layer) is K1):
                return False
            _v0 = L_layer._modules['linear']      # read once, where a check first needs it
            return bool(type(_v0) is K2 and _v0._parameters['weight'].dtype is K3 and ...)
        except Exception:           # a source that no longer resolves: not this entry
            return False

Each source the checks read more than once (itself or through a source under it: ``x.linear``
for ``x.linear.weight``) is read once per call, into a local, just before the first check
that reads it, so after every check before that one (the order that keeps a check that would
raise behind the one protecting it); the checks after it, and the sources under it, start
from the local. A module's parameter, buffer or submodule is read from the dict
``nn.Module.__getattr__`` finds it in (``GuardSet.module_entry``), without the failed
attribute lookup that precedes ``__getattr__`` (microseconds each).

``GuardSet.first_failing`` re-checks them one by one to name the guard that failed, for
recompilation messages and ``explain()``.

The structure of a compiled module is guarded by one integer: its tree's *module epoch*
(``ModuleTree``), counted by torch's global registration hooks whenever a module of that
tree (the root and every module under it) gains or replaces a parameter, buffer or
submodule (assigning ``model.fc = nn.Linear(...)`` included), so the root's parameters and
submodules need no per-value guard. Two things do not count: a module outside the tree
registering anything (a slice of a ``ModuleList``, which builds a new one, a backend's
lowering, another model), and registering the object already registered under that name (a
forward that re-registers its buffer on every call changes nothing). Replacing
``param.data`` with a tensor of another dtype or shape is seen by the one check over the held
parameters and buffers (``Recording``); what registers nothing (``del model.fc``, writing
``model._modules`` directly) by the check that each held object is still registered where it
was (``Recording._guard_registered``); documented in docs/compile.md. A function compiled
without a root module has no epoch guard: the modules it reads are reached through guarded
sources (identity of each submodule, metadata of each tensor).

Depends on ``fxloom.bytecode.sources`` and torch.
"""

from __future__ import annotations

import functools
import itertools
import re
import sys
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from fxloom.bytecode import dynamic
from fxloom.bytecode.sources import Attr, Item, Local, Source, local_name

__all__ = [
    "Guard",
    "GuardSet",
    "disjoint_storage",
    "global_state",
    "module_registry",
    "ModuleTree",
    "module_epoch",
    "storage_key",
    "tree_of",
    "watch_modules",
]

# Cheapest first: identities and exact types, then tensor metadata, then values and lengths.
_IDENTITY, _TENSOR, _VALUE, _STRUCTURE = range(4)


class ModuleTree:
    """The modules under one compiled root, and how many times one of them gained or replaced
    a parameter, buffer or submodule since the tree was first compiled (``epoch``).

    Which modules belong to the tree is computed lazily: a change can add or drop modules, so
    after one the membership is *stale* and every registration anywhere counts as a change
    (conservative) until the next compilation of the root refreshes it (``refresh``, done by
    each ``GuardSet`` that guards the tree, before it reads the epoch)."""

    __slots__ = ("epoch", "_root", "_members", "__weakref__")

    def __init__(self, root: torch.nn.Module) -> None:
        self.epoch = 0
        self._root = weakref.ref(root)
        self._members: frozenset[int] | None = None  # ids of the tree's modules; None: stale

    def refresh(self) -> None:
        root = self._root()
        self._members = frozenset() if root is None else frozenset(map(id, root.modules()))

    def holds(self, module: torch.nn.Module) -> bool:
        members = self._members
        return members is None or id(module) in members

    def changed(self) -> None:
        self.epoch += 1
        self._members = None


_TREES: weakref.WeakKeyDictionary[torch.nn.Module, ModuleTree] = weakref.WeakKeyDictionary()


def tree_of(root: torch.nn.Module) -> ModuleTree:
    """The ``ModuleTree`` of ``root`` (one per module, shared by every compilation of it)."""
    tree = _TREES.get(root)
    if tree is None:
        tree = _TREES[root] = ModuleTree(root)
        tree.refresh()
    return tree


def module_epoch(root: torch.nn.Module) -> int:
    """How many times a module of ``root``'s tree gained or replaced a parameter, buffer or
    submodule since ``root`` was first compiled or asked about (what its entries guard)."""
    return tree_of(root).epoch


_MISSING = object()


def _registered(registry: str, module: torch.nn.Module, name: str, value: Any) -> None:
    """Torch's global registration hook for the module dict ``registry`` (``_parameters``,
    ``_buffers``, ``_modules``), called before the value is stored: a change to every tree
    that holds ``module``, unless the same object is registered again."""
    if module.__dict__.get(registry, {}).get(name, _MISSING) is value:
        return
    for tree in list(_TREES.values()):
        if tree.holds(module):
            tree.changed()


def _registration_hook(registry: str) -> Callable[..., None]:
    # A partial (a C callable), not a Python function: a program under compilation that
    # registers something calls it natively, as Python would, instead of interpreting
    # fxloom's own bookkeeping (and guarding it); a tensor passed to it is a graph break.
    return functools.partial(_registered, registry)


_WATCHING: list[bool] = []


def watch_modules() -> None:
    """Count module structure changes from now on (torch's global registration hooks; done
    by the first ``fxloom.compile``, so importing fxloom changes nothing in torch)."""
    if not _WATCHING:
        hooks = torch.nn.modules.module
        hooks.register_module_parameter_registration_hook(_registration_hook("_parameters"))
        hooks.register_module_buffer_registration_hook(_registration_hook("_buffers"))
        hooks.register_module_module_registration_hook(_registration_hook("_modules"))
        _WATCHING.append(True)


def global_state() -> tuple:
    """The global state a graph depends on: grad mode, inference mode, autocast, default dtype,
    deterministic algorithms. Compared as one tuple."""
    return (
        torch.is_grad_enabled(),
        torch.is_inference_mode_enabled(),
        torch._C._is_any_autocast_enabled() and _autocast_state(),
        torch.get_default_dtype(),
        torch.are_deterministic_algorithms_enabled(),
    )


def _autocast_state() -> tuple:
    """Inside autocast: which device casts to which dtype (a graph recorded under bfloat16
    autocast is not the one for float16), and whether casts are cached."""
    return (
        *((torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in ("cpu", "cuda")),
        torch.is_autocast_cache_enabled(),
    )


def storage_key(tensor: torch.Tensor) -> int:
    """Where ``tensor``'s elements live: its storage's address. A storage with no bytes
    (address 0, shared by every empty tensor) or no storage at all (sparse) cannot be written
    through another tensor: the tensor stands for itself."""
    try:
        return tensor.untyped_storage().data_ptr() or id(tensor)
    except (RuntimeError, NotImplementedError, TypeError):
        return id(tensor)


def disjoint_storage(*tensors: torch.Tensor) -> bool:
    """Whether no two of ``tensors`` share a storage."""
    keys = {storage_key(tensor) for tensor in tensors}
    return len(keys) == len(tensors)


_GLOBAL_STATE_TEXT = (
    "grad mode, inference mode, autocast, default dtype and deterministic algorithms"
)


@dataclass(frozen=True, slots=True)
class Guard:
    """One assumption: ``check`` is a Python boolean expression over the entry's arguments
    (``L_<name>``), the globals ``G``, closure ``C`` and constants ``K<i>``; ``text`` is how
    messages state it, in the user's names."""

    tier: int
    check: str
    text: str


class GuardSet:
    """The guards of one cache entry, collected while the interpreter runs; see the module
    docstring."""

    def __init__(self, root: torch.nn.Module | None = None) -> None:
        """``root``: the compiled module, whose tree's epoch is guarded (taken now, before
        the program runs: what it registers itself is seen on the next call)."""
        self._guards: dict[tuple[str, str], Guard] = {}
        self.lines: dict[str, tuple] = {}  # guard check -> (code, line) that added it
        self._constants: list[Any] = []
        self._constant_slots: dict[int, str] = {}
        self._tree: ModuleTree | None = None
        # Symbolic sizes (``fxloom.bytecode.dynamic``): None where every size is static.
        self.sizes = dynamic.current()
        # Each tensor read: source -> (its sizes as the entry assumed them, its symbolic dims),
        # which a miss compares with the new call's (``changed_sizes``).
        self.tensor_sizes: dict[Source, tuple[tuple[int, ...], frozenset[int]]] = {}
        # Each int and float guarded by value: source -> the value (``changed_sizes``).
        self.numbers: dict[Source, int | float] = {}
        # Every source a guard reads (``source_code`` reads each once), and the module
        # attributes read from their module's parameter, buffer or submodule dict.
        self._sources: dict[Source, None] = {}
        self._entries: dict[Source, str] = {}
        self._class_dicts: dict[type, str] = {}  # class -> the constant holding its __dict__
        self._code: tuple[tuple, str] | None = None  # the last ``source_code``, by its inputs
        self.add("global state", Guard(_IDENTITY, f"STATE() == {self.constant(global_state())}",
                                       f"{_GLOBAL_STATE_TEXT} as at compile time"))  # fmt: skip
        if root is not None:
            self._tree = tree_of(root)
            self._tree.refresh()
            self.add("module epoch", Guard(_IDENTITY, f"TREE.epoch == {self._tree.epoch}",
                                           f"no module under {type(root).__name__} gained or "
                                           "replaced a parameter, buffer or submodule"))  # fmt: skip

    def __len__(self) -> int:
        return len(self._guards)

    def __iter__(self):
        self._add_shape_guards()
        return iter(sorted(self._guards.values(), key=lambda guard: guard.tier))

    def _add_shape_guards(self) -> None:
        """The ShapeEnv's conditions on the symbolic sizes (after the tensor guards that bind
        them): ranges, the relations the program branched on, specialisations."""
        if self.sizes is not None:
            for check, text in self.sizes.shape_guards():
                self.add(check, Guard(_VALUE, check, text))

    # ------------------------------------------------------------ adding
    def add(self, key: str, guard: Guard) -> None:
        if (key, guard.check) not in self._guards:
            self._guards[key, guard.check] = guard
            # the user's line that read the value (for the recompile budget's message; kept
            # as (code, line), made text only when a miss asks)
            interpreted = dynamic.interpreted_frame()
            if interpreted is not None:
                self.lines.setdefault(guard.check, (interpreted.code, interpreted.line))

    def constant(self, value: Any) -> str:
        """The name generated code reads ``value`` by (one slot per object)."""
        slot = self._constant_slots.get(id(value))
        if slot is None:
            slot = f"K{len(self._constants)}"
            self._constants.append(value)
            self._constant_slots[id(value)] = slot
        return slot

    def identity(self, source: Source, value: Any) -> None:
        self._sources[source] = None
        self.add(source.expr, Guard(_IDENTITY, f"{source.expr} is {self.constant(value)}",
                                    f"{source.text} is the same {_kind(value)}"))  # fmt: skip

    def exact_type(self, source: Source, value: Any) -> None:
        cls = type(value)
        self._sources[source] = None
        self.add(source.expr, Guard(_IDENTITY, f"type({source.expr}) is {self.constant(cls)}",
                                    f"type({source.text}) is {cls.__qualname__}"))  # fmt: skip

    def equals(self, source: Source, value: Any) -> None:
        """``value`` is a Python constant (None, bool, int, float, str, ... or a tuple of them)."""
        if value is None or value is True or value is False or value is Ellipsis:
            self._sources[source] = None
            self.add(source.expr, Guard(_IDENTITY, f"{source.expr} is {value!r}",
                                        f"{source.text} is {value!r}"))  # fmt: skip
            return
        self.exact_type(source, value)
        if type(value) in dynamic.SCALAR_TYPES:
            self.numbers.setdefault(source, value)
        check = f"{source.expr} == {self.constant(value)}"
        self.add(source.expr, Guard(_VALUE, check, f"{source.text} == {value!r}"))

    def number(self, source: Source, value: int | float) -> Any:
        """The int or float ``value`` read from ``source`` as a symbol (``torch.SymInt`` or
        ``SymFloat``), guarded by its type alone, where the size policy has seen it change;
        None where it stays static (then guard it with ``equals``)."""
        if self.sizes is None:
            return None
        symbolic = self.sizes.scalar(source, value)
        if symbolic is not None:
            cls = type(value)
            self._sources[source] = None
            check = self.sizes.scalar_check(source, self.constant(cls))
            self.add(source.expr, Guard(_IDENTITY, check, f"{source.text} is any {cls.__name__} "
                                                          "(symbolic)"))  # fmt: skip
        return symbolic

    def tensor(self, source: Source, tensor: torch.Tensor) -> list | None:
        """Guard the tensor read from ``source``: its type, dtype, device, ``requires_grad``
        and sizes. Returns its sizes with a ``torch.SymInt`` for each dimension the size
        policy makes symbolic (None: all static, guarded by value)."""
        expr, text = source.expr, source.text
        self.exact_type(source, tensor)
        dims = self.sizes.dims(source, tensor) if self.sizes is not None else frozenset()
        self.tensor_sizes.setdefault(source, (tuple(tensor.shape), dims))
        checks = [
            f"{expr}.dtype is {self.constant(tensor.dtype)}",
            f"{expr}.device == {self.constant(tensor.device)}",
            f"{expr}.requires_grad is {tensor.requires_grad}",
        ]
        sizes = None
        if dims:
            sizes = self.sizes.sizes(source, tensor, dims)
            checks.append(self.sizes.tensor_check(source, tensor, dims))
            shown = ", ".join(
                f"{text}.shape[{d}]" if d in dims else str(n) for d, n in enumerate(tensor.shape)
            )
            shape_text = f"shape ({shown})"
        else:
            # Strides too: the program may read them (``x.stride(0)``, ``is_contiguous()``),
            # and capture answered from the example's.
            checks.append(f"{expr}.shape == {self.constant(tensor.shape)}")
            checks.append(f"{expr}.stride() == {self.constant(tensor.stride())}")
            shape_text = f"shape {tuple(tensor.shape)}, strides {tensor.stride()}"
        described = (
            f"{text}: dtype {tensor.dtype}, device {tensor.device}, "
            f"requires_grad={tensor.requires_grad}, {shape_text}"
        )
        self.add(expr, Guard(_TENSOR, " and ".join(checks), described))
        return sizes

    def changed_sizes(
        self,
        arguments: Sequence[Any],
        parameters: Sequence[str],
        globals_: dict,
        closure: tuple | None,
        held: dict | None = None,
    ) -> list[tuple[str, str, int | None, Any, Any]]:
        """The static sizes of this entry's tensors that ``arguments`` change, as (source
        expr, source text, dim, old, new), and its ints and floats guarded by value that
        they change, as (expr, text, None, old, new); tensors whose rank changed and numbers
        whose type changed are not compared."""
        namespace = self._bound_namespace(arguments, parameters, globals_, closure, held)
        changed = []
        for source, (shape, dims) in self.tensor_sizes.items():
            try:
                value = eval(source.expr, namespace)  # noqa: S307 - our own source expressions
            except Exception:
                continue
            if not isinstance(value, torch.Tensor) or value.dim() != len(shape):
                continue
            for dim, (old, new) in enumerate(zip(shape, value.shape)):
                if old != new and dim not in dims:
                    changed.append((source.expr, source.text, dim, old, new))
        for source, old in self.numbers.items():
            try:
                new = eval(source.expr, namespace)  # noqa: S307 - our own source expressions
            except Exception:
                continue
            if type(new) is type(old) and new != old:
                changed.append((source.expr, source.text, None, old, new))
        return changed

    def why_static(self) -> list[str]:
        """Each symbolic size the program fixed to one value, with the line that did."""
        return self.sizes.why_static() if self.sizes is not None else []

    # ------------------------------------------------------------ identity relations
    # Two sources of one tensor share one graph input, and the program's ``x is y`` was
    # decided on the objects it saw: which inputs are the same object is part of what the
    # entry assumed. Storage shared by different objects matters only where the graph writes
    # (``Recording.guard_identities``).
    def same_object(self, source: Source, other: Source) -> None:
        self._sources.update(dict.fromkeys((source, other)))
        check = f"{source.expr} is {other.expr}"
        self.add(check, Guard(_IDENTITY, check, f"{source.text} is {other.text}"))

    def different_objects(self, sources: Sequence[Source]) -> None:
        """No two of ``sources`` are the same object (pairwise ``is not`` while that is
        cheaper than one set of ids)."""
        if len(sources) < 2:
            return
        self._sources.update(dict.fromkeys(sources))
        if len(sources) <= 4:
            for first, second in itertools.combinations(sources, 2):
                check = f"{first.expr} is not {second.expr}"
                self.add(check, Guard(_IDENTITY, check, f"{first.text} is not {second.text}"))
            return
        ids = ", ".join(f"id({source.expr})" for source in sources)
        check = f"len({{{ids}}}) == {len(sources)}"
        text = f"{_listed(source.text for source in sources)} are different objects"
        self.add(check, Guard(_IDENTITY, check, text))

    def none_of(self, source: Source, held: frozenset[int]) -> None:
        """``source`` is none of the root's parameters and buffers the graph reads (``held``:
        their ids; the entry holds them, so the ids stay theirs)."""
        self._sources[source] = None
        check = f"id({source.expr}) not in {self.constant(held)}"
        text = f"{source.text} is none of the module's parameters and buffers the graph reads"
        self.add(check, Guard(_IDENTITY, check, text))

    def disjoint(self, sources: Sequence[Source]) -> None:
        """No two of the tensors at ``sources`` share a storage (``storage_key``)."""
        if len(sources) < 2:
            return
        self._sources.update(dict.fromkeys(sources))
        if len(sources) == 2:  # the common case, without building a set
            check = f"STORAGE({sources[0].expr}) != STORAGE({sources[1].expr})"
        else:
            check = f"DISJOINT({', '.join(source.expr for source in sources)})"
        text = f"{_listed(source.text for source in sources)} share no storage"
        self.add(check, Guard(_STRUCTURE, check, text))

    def same_storage(self, source: Source, tensor: torch.Tensor, other: Source,
                     other_tensor: torch.Tensor) -> None:  # fmt: skip
        """The tensor at ``source`` shares the storage of the one at ``other`` exactly as now:
        same storage, each at the same offset with the same strides (the shapes are guarded)."""
        self._sources.update(dict.fromkeys((source, other)))
        checks = [f"STORAGE({source.expr}) == STORAGE({other.expr})"]
        for place, value in ((source, tensor), (other, other_tensor)):
            checks.append(f"{place.expr}.storage_offset() == {value.storage_offset()}")
            checks.append(f"{place.expr}.stride() == {value.stride()}")
        text = (
            f"{source.text} shares {other.text}'s storage (offsets {tensor.storage_offset()} "
            f"and {other_tensor.storage_offset()}, strides {tensor.stride()} and "
            f"{other_tensor.stride()})"
        )
        self.add(checks[0], Guard(_STRUCTURE, " and ".join(checks), text))

    def length(self, source: Source, value: Sequence[Any]) -> None:
        self.exact_type(source, value)
        self.add(source.expr, Guard(_STRUCTURE, f"len({source.expr}) == {len(value)}",
                                    f"len({source.text}) == {len(value)}"))  # fmt: skip

    def keys(self, source: Source, value: dict) -> None:
        self.exact_type(source, value)
        keys = tuple(value)
        check = f"tuple({source.expr}) == {self.constant(keys)}"
        self.add(source.expr, Guard(_STRUCTURE, check, f"{source.text} has keys {list(keys)}"))

    def hooks(self, source: Source, module: Any) -> None:
        """Module ``source`` has the same forward hooks as now (none, usually), which the
        interpreter inlined; backward hooks are refused before this is asked. And, where its
        class's forward was inlined, no ``forward`` of the instance's own, which
        ``nn.Module.__call__`` would run instead (one assigned after the capture, say), and
        the class's ``forward`` the one inlined; one the instance has is read, and guarded,
        as an attribute."""
        e = source.expr
        self._sources[source] = None
        own = "forward" in getattr(module, "__dict__", {})
        # the class's forward, inlined, is the one the class has at the call: a class patched
        # after the capture (``Model.forward = other``) misses the entry
        class_forward = self.constant(type(module).forward)
        no_own = (
            ""
            if own
            else (f" and 'forward' not in {e}.__dict__ and type({e}).forward is {class_forward}")
        )
        no_own_text = "" if own else " and no forward of its own, its class's the one compiled"
        kinds = ("_forward_pre_hooks", "_forward_hooks", "_backward_hooks", "_backward_pre_hooks")
        now = tuple(tuple(getattr(module, kind)) for kind in kinds)
        if not any(now):
            check = " or ".join(f"{e}.{kind}" for kind in kinds)
            self.add(e + " hooks", Guard(_STRUCTURE, f"not ({check}){no_own}",
                                         f"{source.text} has no hooks{no_own_text}"))  # fmt: skip
            return
        check = f"({', '.join(f'tuple({e}.{kind})' for kind in kinds)}) == {self.constant(now)}"
        self.add(e + " hooks", Guard(_STRUCTURE, check + no_own,
                                     f"{source.text} has the same hooks{no_own_text}"))  # fmt: skip

    def module_entry(self, source: Attr, registry: str, classes: Sequence[type]) -> None:
        """Generated code reads module attribute ``source`` as ``base.<registry>[name]``:
        ``registry`` (``_parameters``, ``_buffers`` or ``_modules``) is where
        ``nn.Module.__getattr__`` found it (``module_registry``). The same read where the
        base's exact type (or identity) is guarded, as every module read is: no class of
        its MRO has an attribute of that name (which Python would find first), guarded for
        ``classes`` (the user's; torch's are taken as they are), one ``in`` on the class's
        live ``__dict__`` each; the instance has none (torch's ``__setattr__`` and
        ``register_*`` keep a name in one place at a time; writing ``__dict__`` directly is
        not seen); a name gone from its dict is a ``KeyError``, a miss. And the base's class
        still looks attributes up as ``nn.Module`` does (``_LOOKUP``)."""
        self._entries[source] = registry
        # The dict read stands for the attribute lookup only while the lookup is nn.Module's
        # (``module_registry`` checked it at the capture): a ``__getattr__`` or
        # ``__getattribute__`` patched later on the class, or on any class of its MRO (torch's
        # ``nn.Module`` included), misses the entry.
        base = source.base.expr
        lookup = [f"type({base}).{name} is {self.constant(value)}" for name, value in _LOOKUP]
        text = f"{source.base.text}'s class looks attributes up as nn.Module does"
        self.add(base + " lookup", Guard(_STRUCTURE, " and ".join(lookup), text))
        for cls in classes:
            namespace = self._class_dicts.get(cls)
            if namespace is None:
                namespace = self._class_dicts[cls] = self.constant(vars(cls))
            check = f"{source.name!r} not in {namespace}"
            text = f"class {cls.__qualname__} has no attribute {source.name!r}"
            self.add(check, Guard(_STRUCTURE, check, text))

    # ------------------------------------------------------------ generating
    def source_code(self, parameters: Sequence[str]) -> str:
        """The generated guard function's source (also shown by ``compiled.code``): the
        checks in order, each source they read more than once read into a local just before
        the first check that reads it (see the module docstring)."""
        guards = list(self)
        key = (tuple(parameters), len(guards), len(self._sources), len(self._entries))
        if self._code is not None and self._code[0] == key:  # entry.py's, then ``compile``'s
            return self._code[1]
        arguments = ", ".join(local_name(name) for name in parameters)
        reads = _Reads(self._sources, self._entries)
        found = [reads.find(guard.check) for guard in guards]
        for places in found:
            reads.count(places)
        blocks: list[str] = []
        pending: list[str] = []
        for guard, places in zip(guards, found, strict=True):
            bindings: list[str] = []
            check = reads.rewrite(guard.check, places, bindings)
            if bindings and pending:
                blocks.append(f"        if not ({_joined(pending)}):\n            return False\n")
                pending = []
            blocks.extend(f"        {binding}\n" for binding in bindings)
            pending.append(check)
        code = (
            f"def guard({arguments}):\n"
            "    try:\n"
            f"{''.join(blocks)}"
            f"        return bool({_joined(pending) if pending else 'True'})\n"
            "    except Exception:\n"
            "        return False\n"
        )
        self._code = (key, code)
        return code

    def read_code(self, source: Source) -> str:
        """The fastest expression reading ``source`` after the guards passed (its module
        attributes from their dicts, ``module_entry``): what ``run`` passes the graph."""
        if not isinstance(source, Attr | Item):
            return source.expr
        return _read_under(source, self.read_code(source.base), self._entries.get(source))

    def compile(
        self,
        parameters: Sequence[str],
        globals_: dict,
        closure: tuple | None,
        held: dict | None = None,
    ) -> Callable[..., bool]:
        namespace = self._namespace(globals_, closure, held)
        exec(compile(self.source_code(parameters), "<fxloom guard>", "exec"), namespace)
        return namespace["guard"]

    def first_failing(
        self,
        arguments: Sequence[Any],
        parameters: Sequence[str],
        globals_: dict,
        closure: tuple | None,
        held: dict | None = None,
    ) -> Guard | None:
        """The first guard that does not hold for ``arguments`` (None: all hold)."""
        namespace = self._bound_namespace(arguments, parameters, globals_, closure, held)
        for guard in self:
            try:
                if not eval(guard.check, namespace):  # noqa: S307 - our own generated checks
                    return guard
            except Exception:
                return guard
        return None

    def _bound_namespace(
        self,
        arguments: Sequence[Any],
        parameters: Sequence[str],
        globals_: dict,
        closure: tuple | None,
        held: dict | None,
    ) -> dict[str, Any]:
        """The guard function's namespace with its parameters bound to ``arguments``: where
        ``first_failing`` and ``changed_sizes`` evaluate one check at a time, as the compiled
        guard would."""
        namespace = self._namespace(globals_, closure, held)
        namespace.update(zip((local_name(name) for name in parameters), arguments))
        return namespace

    def _namespace(
        self, globals_: dict, closure: tuple | None, held: dict | None
    ) -> dict[str, Any]:
        namespace: dict[str, Any] = {
            "G": globals_,
            "C": closure or (),
            "TREE": self._tree,
            "R": held or {},
        }
        namespace["MODULES"] = sys.modules
        namespace["STATE"] = global_state
        namespace["STORAGE"] = storage_key
        namespace["DISJOINT"] = disjoint_storage
        namespace.update(zip((f"K{i}" for i in itertools.count()), self._constants))
        if self.sizes is not None:
            namespace.update(self.sizes.namespace())
        return namespace


# Where ``nn.Module.__getattr__`` looks, in its order.
_MODULE_REGISTRIES = ("_parameters", "_buffers", "_modules")
# nn.Module's own lookup, as torch defines it (``nn.Module.__getattr__`` patched later is not it)
_MODULE_GETATTR = torch.nn.Module.__getattr__
# What Python runs to look an attribute up on a module, as nn.Module has it: a module entry
# read from its dict holds while the class's are these.
_LOOKUP = (("__getattr__", _MODULE_GETATTR), ("__getattribute__", object.__getattribute__))


def module_registry(module: Any, name: str) -> str | None:
    """The dict of ``module`` (``_parameters``, ``_buffers``, ``_modules``) that
    ``module.name`` is read from, where reading it there is the same read: the class looks
    attributes up as ``nn.Module`` does (its ``__getattribute__`` is object's, its
    ``__getattr__`` nn.Module's) and neither the class (its MRO) nor the instance has an
    attribute ``name`` of its own, which Python would find first. None: read it as it is."""
    cls = type(module)
    if (
        not isinstance(module, torch.nn.Module)
        or any(getattr(cls, name) is not value for name, value in _LOOKUP)
        or name in module.__dict__
        or any(name in klass.__dict__ for klass in cls.__mro__)
    ):
        return None
    for registry in _MODULE_REGISTRIES:
        if name in module.__dict__.get(registry, ()):
            return registry
    return None


def _joined(checks: Sequence[str]) -> str:
    return "\n                and ".join(checks)


# Where a source's expression may start in a check: a local (``L_x``, ``S_stack_0_``), a
# global, cell, held value or module global, or ``getattr(`` of one; a string literal is
# matched whole, so that nothing inside one (an item's key) is taken for a read.
_STRING = r"""'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*\""""
_READ_START = re.compile(
    rf"(?P<string>{_STRING})|(?<![\w.])(?:[LS]_\w+|(?:G|C|R|MODULES)(?=\[)|getattr\()"
)
# What may follow a source to read one under it: ``.name`` or ``[key]`` (a constant's repr)
_TRAILER = re.compile(rf"\.\w+|\[(?:{_STRING}|[^\]'\"])*\]")


class _Reads:
    """The sources in generated checks, and how a guard function reads each one once. Keyed
    by expression (a str caches its hash; a source's is recomputed down its chain)."""

    def __init__(self, sources: dict[Source, None], entries: dict[Source, str]) -> None:
        self._entries = {source.expr: registry for source, registry in entries.items()}
        self._known: dict[str, Source] = {}
        self._base: dict[str, str] = {}  # an attribute's or item's expression -> its base's
        for source in sources:
            expr = source.expr
            while expr not in self._known:
                self._known[expr] = source
                if not isinstance(source, Attr | Item):
                    break
                source = source.base
                self._base[expr] = source.expr
                expr = source.expr
        # the ones spelled ``getattr(...)``, which ``find`` tries one by one, longest first
        self._spelled = sorted(
            (expr for expr in self._known if expr.startswith("getattr(")), key=len, reverse=True
        )
        self._counts: dict[str, int] = {}
        self._names: dict[str, str] = {}

    def find(self, check: str) -> list[tuple[int, int, Source]]:
        """Where ``check`` reads a known source: (start, end, source), in order."""
        places = []
        position = 0
        while self._known and (start := _READ_START.search(check, position)) is not None:
            position = start.end()
            if start["string"] is None:
                found = self._at(check, start.start(), start.end())
                if found is not None:
                    places.append(found)
                    position = found[1]
        return places

    def _at(self, check: str, begin: int, root_end: int) -> tuple[int, int, Source] | None:
        """The longest known source whose expression starts at ``begin`` (None: none)."""
        if check.startswith("getattr(", begin):
            for expr in self._spelled:
                end = begin + len(expr)
                if check.startswith(expr, begin) and not _continues(check, end):
                    return begin, end, self._known[expr]
            return None
        ends = [root_end]
        while (trailer := _TRAILER.match(check, ends[-1])) is not None:
            ends.append(trailer.end())
        for end in reversed(ends):
            source = self._known.get(check[begin:end])
            if source is not None:
                return begin, end, source
        return None

    def count(self, places: list[tuple[int, int, Source]]) -> None:
        """Count each place's read, and the reads of the sources it is read through."""
        counts, bases = self._counts, self._base
        for _, _, source in places:
            expr: str | None = source.expr
            while expr is not None:
                counts[expr] = counts.get(expr, 0) + 1
                expr = bases.get(expr)

    def rewrite(self, check: str, places: list, bindings: list[str]) -> str:
        """``check`` reading each place through ``code`` (locals bound into ``bindings``)."""
        parts, last = [], 0
        for start, end, source in places:
            parts += (check[last:start], self.code(source, bindings, check[start:end]))
            last = end
        return "".join(parts) + check[last:]

    def code(self, source: Source, bindings: list[str], expr: str | None = None) -> str:
        """An expression reading ``source`` (``expr``: its expression, where known): its
        local once bound; one read more than once is bound to a new local (a statement
        appended to ``bindings``)."""
        expr = source.expr if expr is None else expr
        name = self._names.get(expr)
        if name is not None:
            return name
        if isinstance(source, Local):
            return expr
        if isinstance(source, Attr | Item):
            base_expr = self._base.get(expr)
            base = self.code(source.base, bindings, base_expr)
            code = _read_under(source, base, self._entries.get(expr))
        else:
            code = expr
        if self._counts.get(expr, 0) < 2:
            return code
        name = self._names[expr] = f"_v{len(self._names)}"
        bindings.append(f"{name} = {code}")
        return name


def _read_under(source: Attr | Item, base: str, registry: str | None) -> str:
    """``source`` read from ``base`` (an expression for its base's value): from the module
    dict ``registry`` where one is given (``GuardSet.module_entry``)."""
    if registry is None:
        return source.on(base)
    return f"{base}.{registry}[{source.name!r}]"  # type: ignore[union-attr] - an Attr


def _continues(check: str, end: int) -> bool:
    """Whether ``check[end]`` continues a name (``x.ab`` is no read of ``x.a``)."""
    return end < len(check) and (check[end].isalnum() or check[end] == "_")


def _listed(texts: Any) -> str:
    """``x``, ``x and y``, ``x, y and z``."""
    texts = list(texts)
    return texts[0] if len(texts) == 1 else f"{', '.join(texts[:-1])} and {texts[-1]}"


def _kind(value: Any) -> str:
    if isinstance(value, torch.nn.Module):
        return f"{type(value).__name__} module"
    if isinstance(value, type):
        return "class"
    if callable(value):
        return "function"
    return type(value).__name__
