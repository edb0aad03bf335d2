"""One compilation's state: what was read from outside (with guards), the graph, what was built.

The interpreter holds real Python values; ``Recording`` knows, for the ones that came from
outside the compiled function, where they came from (``source_of``), and turns every read
from outside into a value the program can use plus the guards that make reusing the result
safe (``read``):

==========================  ======================================  ===========================
value read                  what the program gets                   guard
==========================  ======================================  ===========================
None, bool, int, float, str the value itself                        equal (and same type)
int, float seen to change   a ``SymInt``/``SymFloat``, a graph      type; what the program
(``fxloom.bytecode.dynamic``) input                                 decides on it
tensor                      a stand-in, a graph input               type, dtype, device, grad,
                                                                    shape
parameter or buffer of the  a stand-in, a graph input read at call  the module epoch; still
root module                 time                                    registered where it was
submodule of the root       the module itself                       the same two
function, class, module,    the value itself                        identity
other module
class made at a graph break the class itself                        type; attributes as they
(``made_at_break``)                                                 are read
list, tuple, dict           the same container, or a copy holding   type and length (dict:
                            stand-ins for its tensors               keys); items read as above
Enum member                 the value itself                        identity
set, frozenset of constants the value itself                        equal (and same type)
any other object            the object itself                       exact type; attributes as
                                                                    they are read
==========================  ======================================  ===========================

A value guarded by its type alone (the last row, a dict whose keys are not constants) is
*unguarded* (``unguarded``): the program may read its attributes and items, each guarded as it
is read, but no native function or operator may receive it (``fxloom.bytecode.calls``), since
what C code reads of it would be decided once, at capture. That covers what Python computed
at a graph break (a numpy array from ``x.numpy()``, an iterator, a class made by a ``class``
statement: a new one at every call), read by the next piece as its inputs. A native call that reads an outside object (``len`` of a deque, ``hasattr``)
guards its result on the real object instead (``guard_call``).

The tensors read are guarded together as well, after the graph is recorded
(``guard_identities``): which sources hold the same object, and, where the graph writes,
which share storage. Objects the program builds (``created``) need no guard. Changing an object from outside is a
side effect (``fxloom.bytecode.side_effects``): an attribute assigned (``write_attribute``),
a global or cell stored (``store_global``, ``store_cell``), a list, dict, set or deque changed
(``mutate_outside``, ``write_target``) are kept aside in ``changes`` -- later reads see them
-- and the compiled entry replays them after its graph.

Depends on ``fxloom.bytecode.guards``, ``graph_builder``, ``sources`` and torch.
"""

from __future__ import annotations

import builtins
import collections
import enum
import operator
import re
import sys
import types
import weakref
from typing import Any

import torch

from fxloom.bytecode.breaks import Break
from fxloom.bytecode.callees import OUTSIDE_STATE, is_library_module
from fxloom.bytecode.dynamic import concrete
from fxloom.bytecode.graph_builder import GraphBuilder
from fxloom.bytecode.guards import (
    _STRUCTURE,
    _VALUE,
    Guard,
    GuardSet,
    module_registry,
    storage_key,
)
from fxloom.bytecode.side_effects import NOT_CHANGED, Changes, kind_of
from fxloom.bytecode.sources import Attr, Global, Held, Item, Local, Source, TypeOf
from fxloom.values.symbolic_scalars import SYMBOLIC_TYPES

__all__ = ["Recording", "CONSTANT_TYPES", "NOT_WRITTEN", "made_at_break"]

NOT_WRITTEN = object()

# Classes a ``class`` statement made as Python at a graph break (``LOAD_BUILD_CLASS``), by id:
# each call of the function makes a new one from the same body, so the next piece must not
# guard its identity (it would recompile at every call) nor take it as a constant (it would
# keep the first call's class). Read as an unguarded value instead (see the docstring).
_MADE_AT_BREAK: weakref.WeakValueDictionary[int, type] = weakref.WeakValueDictionary()


def made_at_break(cls: type) -> None:
    """Note that ``cls`` was made by a ``class`` statement run as Python at a graph break."""
    _MADE_AT_BREAK[id(cls)] = cls


CONSTANT_TYPES = frozenset(
    (type(None), bool, int, float, complex, str, bytes, type(Ellipsis), type(NotImplemented))
)
# Compared by equality: values of these types are immutable descriptions.
_EQUAL_TYPES = frozenset(
    (torch.device, torch.Size, slice, range, torch.memory_format, torch.layout, re.Pattern)
)
_IDENTITY_TYPES = (
    type,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.ModuleType,
    types.MethodDescriptorType,
    types.WrapperDescriptorType,
    types.MethodWrapperType,
    types.ClassMethodDescriptorType,
    torch.dtype,
)


class Recording:
    """See the module docstring. ``root`` is the module whose ``forward`` is compiled (or
    None), read from the compiled function's first argument ``root_name``."""

    def __init__(self, root: torch.nn.Module | None = None, root_name: str | None = None) -> None:
        self.guards = GuardSet(root)
        self.graph = GraphBuilder()
        self.keeps_data = True  # ``.item()`` stays in the graph (``calls._data_number``)
        self.created: set[int] = set()  # ids of objects the program built
        self._sources: dict[int, Source] = {}
        # (id(owner), name) -> (owner, name, value): attributes of outside objects assigned
        self.writes: dict[tuple[int, str], tuple[Any, str, Any]] = {}
        # Changes to outside objects and Python output (print, logging, warnings), in one
        # ordered log replayed after the graph; ``deferred`` takes (function, args, kwargs).
        # Each entry's position is the number of graph nodes recorded before it (all nodes
        # but the inputs' placeholders): the entry replays those before an op that raises.
        graph = self.graph
        self.changes = Changes(self.source_of, lambda: len(graph.graph.nodes) - len(graph.inputs))
        self.deferred: list[tuple[Any, tuple, dict]] = self.changes.deferred
        self._alive: list[Any] = []
        # Every source an outside object (not a constant, container, module or function) was
        # read from: objects whose attributes the program assigns are guarded by identity.
        self._objects: dict[Source, Any] = {}
        # ids of the modules from outside the root read by their type (``_module_by_type``)
        self.by_type: set[int] = set()
        # Containers from outside and the copies made of them: changing one is a break.
        self._outside_containers: set[int] = set()
        self._root_paths: dict[int, str] = {}  # id(submodule, parameter or buffer) -> path
        self._through_setter: set[tuple[int, str]] = set()  # (id(owner), name)
        # ids of values read from outside whose type alone is guarded (see the docstring)
        self.unguarded: set[int] = set()
        self._trusted: set[int] = set()  # ids of library state (``_LIBRARY_STATE``)
        self.root = root
        self.held: dict[str, Any] = {}  # path -> submodule: ``R`` of generated code
        # The compiled module's parameter (a module whose forward takes ``*args`` gets it
        # inside them: no name, guarded as an item like any other).
        self.root_source = None if root is None else Local(root_name or "self")
        self.root_name = root_name
        if root is not None:
            for path, module in root.named_modules(remove_duplicate=False):
                self._root_paths.setdefault(id(module), path)
                self.held.setdefault(path, module)
            for path, tensor in root.named_parameters(remove_duplicate=False):
                self._root_paths.setdefault(id(tensor), path)
                self.held.setdefault(path, tensor)
            for path, tensor in root.named_buffers(remove_duplicate=False):
                self._root_paths.setdefault(id(tensor), path)
                self.held.setdefault(path, tensor)

    # ------------------------------------------------------------ sources
    def source_of(self, value: Any) -> Source | None:
        source = self._sources.get(id(value))
        if source is None and self.root_source is not None:
            path = self._root_paths.get(id(value))
            if path is not None:
                source = Held(path)
        return source

    def root_path(self, module: torch.nn.Module) -> str | None:
        return self._root_paths.get(id(module))

    def is_outside(self, value: Any) -> bool:
        """Whether ``value`` exists outside the compiled function (changing it is a side
        effect a caller can see)."""
        key = id(value)
        return key in self._outside_containers or (key in self._sources or key in self._root_paths)

    def built(self, value: Any) -> Any:
        """Mark ``value`` as made by the program (no guard; its changes are its own)."""
        self.created.add(id(value))
        self._alive.append(value)
        return value

    # ------------------------------------------------------------ changes to outside objects
    def write_attribute(self, owner: Any, name: str, value: Any) -> None:
        """``owner.name = value`` on an object from outside: kept aside (later reads see it)
        and replayed by the compiled entry after its graph runs (in program order where the
        class has a setter of its own, whose effect a read back cannot know)."""
        if self.source_of(owner) is None:
            raise Break(
                "outside-mutation",
                f"{name} of a {type(owner).__name__} reached by no source is assigned",
            )
        self.writes[(id(owner), name)] = (owner, name, value)
        ordered = _own_setter(owner, name)
        self.changes.store(None, owner, name, value, ("attr", id(owner), name), ordered)
        if ordered:
            self._through_setter.add((id(owner), name))

    def written(self, owner: Any, name: str) -> Any:
        """The value the program assigned to ``owner.name`` so far, or ``NOT_WRITTEN``."""
        if (id(owner), name) in self._through_setter:
            raise Break(
                "outside-mutation",
                f"{name} of a {type(owner).__name__} is read back after a setter of its class "
                "assigned it",
            )
        found = self.writes.get((id(owner), name))
        return NOT_WRITTEN if found is None else found[2]

    def store_global(self, namespace: dict, name: str, value: Any, source: Source) -> None:
        """``global name; name = value``: replayed after the graph; later reads see it."""
        self.changes.store(source, None, name, value, ("global", id(namespace), name))

    def global_value(self, namespace: dict, name: str) -> Any:
        """The value the program stored in global ``name`` so far, or ``NOT_WRITTEN``."""
        found = self.changes.stored(("global", id(namespace), name))
        return NOT_WRITTEN if found is NOT_CHANGED else found

    def store_cell(self, cell: Any, value: Any, source: Source) -> None:
        """``nonlocal name; name = value`` on a cell from outside: replayed after the graph."""
        self._alive.append(cell)
        self.changes.store(source, None, "cell_contents", value, ("cell", id(cell), ""))

    def cell_value(self, cell: Any) -> Any:
        """The value the program stored in ``cell`` so far, or ``NOT_WRITTEN``."""
        found = self.changes.stored(("cell", id(cell), ""))
        return NOT_WRITTEN if found is NOT_CHANGED else found

    def mutate_outside(self, target: Any, fn: Any, args: tuple, kwargs: dict) -> Any:
        """``fn(*args, **kwargs)``, a call that changes the outside object ``target``: a method
        bound to it (``LOG.append``, ``d.__setitem__``), or a function given it first
        (``list.append(LOG, x)``, ``operator.setitem(d, k, v)``, ``setattr(obj, name, v)``).
        Made on the program's view of it and replayed after the graph; returns what the call
        returns (``list.pop``'s item)."""
        name = getattr(fn, "__name__", "")
        if getattr(fn, "__self__", None) is not target:  # a function: the target comes first
            name = _FUNCTION_FORMS.get(fn) or (name if hasattr(fn, "__objclass__") else "")
            if not name or not args or args[0] is not target:
                raise Break(
                    "outside-mutation",
                    f"{getattr(fn, '__qualname__', fn)!s} changes a {type(target).__name__} "
                    "from outside in a way fxloom does not replay",
                )
            args = args[1:]
        if name == "__setattr__":
            self.write_attribute(target, *args)
            return None
        if args and isinstance(target, _HASHED):  # a key or member is hashed by its value
            args = (concrete(args[0]), *args[1:])
        return self.changes.call(target, name, tuple(args), kwargs)

    def write_target(self, value: Any, source: Source) -> Any:
        """``value`` (a list, dict, set or deque at ``source``), read only to be changed by a
        blind method next (``LOG.append(x)``): guarded by identity, its contents not read, so
        an append log never recompiles. Read as usual where the program read it before."""
        view = self.changes.view_of(value)
        if view is not None:  # changed already: the same view, without reading it
            return view
        if self.source_of(value) is not None or not self.changes.write_only(value, source):
            return self.read(value, source)
        self.guards.identity(source, value)
        self._remember(value, source)
        self._outside_containers.add(id(value))
        return value

    def _container_method(self, method: Any, source: Source) -> Any:
        """``LOG.append`` handed on by the piece before a graph break: its list read from
        ``source.__self__`` (so that calling it changes an outside list, replayed) and the
        method taken again from what the program holds of it."""
        self.guards.exact_type(source, method)
        self.guards.equals(Attr(source, "__name__"), method.__name__)
        owner, name = method.__self__, method.__name__
        if type(owner) in _CHANGEABLE and name in kind_of(owner).blind:
            held = self.write_target(owner, Attr(source, "__self__"))
        else:
            held = self.read(owner, Attr(source, "__self__"))
        return getattr(held, name)

    def close_changes(self) -> None:
        """Capture is over: the changes' last states logged, real objects put back."""
        self.changes.close()

    # ------------------------------------------------------------ reading
    def read(self, value: Any, source: Source | None, trusted: bool = False) -> Any:
        """``value``, read from ``source``, as the program sees it; see the module docstring.
        ``trusted``: library state (see ``_LIBRARY_STATE``)."""
        kind = type(value)
        if source is None:
            if kind in _CHANGEABLE and id(value) not in self.created:
                # From outside, reached by no source (a closure of a hook): changing it
                # cannot be replayed, so it must not be changed natively either (a break).
                self._outside_containers.add(id(value))
                self._alive.append(value)
            return self.graph.adopt(value)
        if kind in _CHANGEABLE:  # the program's own view of it, once it changed or copied it
            held = self.changes.program_object(value, lambda real: self.read(real, source))
            if held is not None:
                return held
        elif kind is types.BuiltinMethodType and type(value.__self__) in _CHANGEABLE:
            return self._container_method(value, source)
        if kind in SYMBOLIC_TYPES:  # a number made symbolic, read again through a copy
            return value  # of an outside container that holds it: guarded when first read
        if kind in CONSTANT_TYPES:
            if (kind is int or kind is float) and self.graph.takes_numbers:
                # symbolic once it changed (``dynamic``)
                symbolic = self.guards.number(source, value)
                if symbolic is not None:
                    return self.graph.number_input(source, symbolic)
            self.guards.equals(source, value)
            return value
        if isinstance(value, torch.Tensor):
            if self.graph.node_of(value) is not None:
                # A stand-in of this graph, read again through a copy of an outside container
                # that holds it: guarded when it was first read (or made by the graph).
                return value
            return self._tensor(value, source)
        if isinstance(value, torch.nn.Module):
            return self._module(value, source)
        if kind is types.MethodType:
            trusted = trusted or id(value.__self__) in self._trusted
            self.read(value.__func__, Attr(source, "__func__"), trusted)
            self.read(value.__self__, Attr(source, "__self__"), trusted)
            return value
        if isinstance(value, type) and _MADE_AT_BREAK.get(id(value)) is value:
            return self._unguarded(value, source)
        if isinstance(value, _IDENTITY_TYPES) or kind in _EQUAL_TYPES:
            if kind in _EQUAL_TYPES:
                self.guards.equals(source, value)
            else:
                self.guards.identity(source, value)
            self._remember(value, source)
            return value
        if trusted or (type(source) is Global and _library_global(source, value)):
            self._remember(value, source)  # library state: taken as it is
            self._trusted.add(id(value))
            return value
        if kind is list or kind is tuple or (kind is dict and _constant_keys(value)):
            return self._container(value, source)
        if isinstance(value, enum.Enum):  # members are singletons: compared by identity
            self.guards.identity(source, value)
            self._remember(value, source)
            return value
        if (kind is set or kind is frozenset) and all(
            type(item) in CONSTANT_TYPES for item in value
        ):
            self.guards.exact_type(source, value)
            check = f"{source.expr} == {self.guards.constant(frozenset(value))}"
            self.guards.add(source.expr, Guard(_VALUE, check, f"{source.text} == {value!r}"))
            self._remember(value, source)
            return value
        return self._unguarded(value, source)

    def _unguarded(self, value: Any, source: Source) -> Any:
        """``value`` read with its type alone guarded (see the module docstring)."""
        self.guards.exact_type(source, value)
        self._remember(value, source)
        self._objects.setdefault(source, value)
        self.unguarded.add(id(value))
        return value

    def is_unguarded(self, value: Any) -> bool:
        """Whether ``value`` came from outside with only its type guarded (see the docstring)."""
        return id(value) in self.unguarded

    def guard_call(self, fn: Any, args: tuple, result: Any) -> bool:
        """Guard that ``fn(*args)`` still gives ``result`` (a constant), each argument read
        again from its source (or a constant itself): what a native call read of an object from
        outside, re-evaluated on the real objects. False when no such guard can be written (a
        result that is no constant, an argument with no source)."""
        if type(result) not in CONSTANT_TYPES:
            return False
        exprs, texts = [], []
        for arg in args:
            if type(arg) in CONSTANT_TYPES:
                exprs.append(self.guards.constant(arg))
                texts.append(repr(arg))
                continue
            source = self.source_of(arg)
            if source is None:
                return False
            exprs.append(source.expr)
            texts.append(source.text)
        name = getattr(fn, "__qualname__", None) or repr(fn)
        call = f"{self.guards.constant(fn)}({', '.join(exprs)})"
        if result is None or type(result) is bool:
            check = f"{call} is {result!r}"
        else:
            check = f"({call}) == {self.guards.constant(result)}"
        text = f"{name}({', '.join(texts)}) == {result!r}"
        self.guards.add(check, Guard(_STRUCTURE, check, text))
        return True

    def read_attribute(self, owner: Any, name: str, value: Any) -> Any:
        """``owner.name`` (already read natively as ``value``) as the program sees it."""
        if id(owner) in self.created:
            return self.graph.adopt(value)
        source = self.source_of(owner)
        if source is None:
            return self.graph.adopt(value)
        if (
            type(owner) is types.ModuleType
            and isinstance(value, _CODE)
            and is_library_module(owner.__name__)
        ):
            self._remember(value, Attr(source, name))  # library code is taken as it is
            return value
        if type(value) in _BOUND_C_METHODS and value.__self__ is owner:
            # ``d.items``, a new object at every read: no identity guard (the owner's type
            # fixes it), but a source, so that a piece hands on the one bound to the real owner
            self._remember(value, Attr(source, name))
            return value
        if isinstance(value, torch.Tensor | torch.nn.Module) and self.root_source is not None:
            path = self._root_paths.get(id(value))
            if path is not None:
                return self.read(value, Held(path))
        attribute = Attr(source, name)
        registry = module_registry(owner, name)
        if registry is not None:  # a parameter, buffer or submodule: read from its dict
            classes = [
                cls for cls in type(owner).__mro__[:-1] if not is_library_module(cls.__module__)
            ]
            self.guards.module_entry(attribute, registry, classes)
        return self.read(value, attribute, id(owner) in self._trusted)

    def read_item(self, container: Any, key: Any, value: Any) -> Any:
        """``container[key]`` for a constant ``key``, as the program sees it."""
        if id(container) in self.created or self.changes.item_read(container):
            return self.graph.adopt(value)
        source = self.source_of(container)
        if source is None:
            return self.graph.adopt(value)
        return self.read(value, Item(source, key), id(container) in self._trusted)

    def read_variadic(self, value: tuple | dict, source: Source) -> tuple | dict:
        """A call's ``*args`` tuple or ``**kwargs`` dict (new for every call): its length or
        keys guarded, each item read from its place, the container itself a new one."""
        if type(value) is dict:
            self.guards.keys(source, value)
            return {key: self.read(item, Item(source, key)) for key, item in value.items()}
        self.guards.length(source, value)
        return tuple(self.read(item, Item(source, index)) for index, item in enumerate(value))

    def _tensor(self, tensor: torch.Tensor, source: Source) -> Any:
        if self.root_source is not None:
            path = self._root_paths.get(id(tensor))
            if path is not None:  # a parameter or buffer: read at call time, no value guard
                if source != Held(path):  # passed in as well (an argument): the same object
                    self.guards.same_object(source, Held(path))
                return self.graph.input(Held(path), tensor, held=True)
        sizes = self.guards.tensor(source, tensor)  # symbolic where the size policy says
        return self.graph.input(source, tensor, sizes=sizes)

    def guard_identities(self, graph_writes: bool) -> None:
        """Guard how the tensors read from outside relate, as the graph assumed: sources that
        held one object share its graph input (``y is x``); different objects stay different
        (``x is not y``) and none of them becomes a parameter the graph reads; and, where the
        graph writes to a tensor, objects that shared no storage still share none while those
        that did share it exactly as now (writing through one changes what the other reads)."""
        groups, tensors = _by_identity(self.graph.reads)
        firsts = self._guard_groups(groups)
        held = frozenset(map(id, self.graph.held.values()))
        for source in firsts if held else ():
            self.guards.none_of(source, held)
        if held:
            self._guard_held(tuple(self.graph.held.values()))
        if self.root is not None:
            self._guard_registered()
        if graph_writes:
            self._guard_storage(groups, tensors)
        # Other objects: the entry reads an object's attributes through the first source it
        # came from (``source_of``), so ``q is p`` where one object came twice. An attribute
        # assigned through one object is read through every alias of it, so where the program
        # assigns attributes of a type, its objects are also guarded to stay different.
        written = {type(owner) for owner, _, _ in self.writes.values()}
        groups = _by_identity(self._objects)[0]
        self._guard_groups(groups, different=False)
        if written:
            self._guard_groups(
                {
                    key: sources
                    for key, sources in groups.items()
                    if type(self._objects[sources[0]]) in written
                }  # fmt: skip
            )

    def _guard_held(self, tensors: tuple) -> None:
        """The root's parameters and buffers the graph reads keep what a tensor input's guard
        checks: dtype, device, ``requires_grad``, shape and strides. The module epoch sees a
        parameter replaced, not ``param.data = other`` (same object, new tensor: another
        size, or the strides ``is_contiguous()`` reads) nor ``requires_grad_(False)`` (a
        branch on it, a layer frozen). One check for all."""
        now = _metadata(tensors)
        check = f"{self.guards.constant(_metadata)}({self.guards.constant(tensors)}) == {self.guards.constant(now)}"
        text = (
            "the module's parameters and buffers the graph reads keep their dtypes, devices, "
            "requires_grad, shapes and strides"
        )
        self.guards.add("held metadata", Guard(_STRUCTURE, check, text))

    def _guard_registered(self) -> None:
        """Every submodule, parameter and buffer the entry holds (``R``) is still where it was
        in the compiled module's tree, hop by hop: the module epoch counts registrations, not
        ``del model.fc``, ``model._modules[name] = ...`` or ``_apply`` writing ``_buffers``,
        after which the entry would run the objects it held. One C-level pass: about 0.1 us
        an entry (430 for BERT-base)."""
        dicts, names, objects = _registrations(self.root, self.held)
        check = (
            f"all(map({self.guards.constant(operator.is_)}, map({self.guards.constant(dict.get)}, "
            f"{self.guards.constant(dicts)}, {self.guards.constant(names)}), "
            f"{self.guards.constant(objects)}))"
        )
        text = (
            "the module's submodules, parameters and buffers are still registered where they were"
        )
        self.guards.add("registrations", Guard(_STRUCTURE, check, text))

    def _guard_groups(
        self, groups: dict[int, list[Source]], different: bool = True
    ) -> list[Source]:
        """``y is x`` within each group of sources of one object, and (``different``) ``x is
        not y`` between the groups; returns each group's first source."""
        firsts = []
        for sources in groups.values():
            for other in sources[1:]:
                self.guards.same_object(other, sources[0])
            firsts.append(sources[0])
        if different:
            self.guards.different_objects(firsts)
        return firsts

    def _guard_storage(self, groups: dict[int, list[Source]], tensors: dict[int, Any]) -> None:
        by_storage: dict[int, list[int]] = {}
        for key in groups:
            by_storage.setdefault(storage_key(tensors[key]), []).append(key)
        for keys in by_storage.values():
            anchor = keys[0]
            for key in keys[1:]:
                self.guards.same_storage(groups[key][0], tensors[key], groups[anchor][0],
                                         tensors[anchor])  # fmt: skip
        self.guards.disjoint([groups[keys[0]][0] for keys in by_storage.values()])

    def _module(self, module: torch.nn.Module, source: Source) -> torch.nn.Module:
        path = self._root_paths.get(id(module))
        if path is None and _brought_by_the_call(source) and read_by_type(module):
            return self._module_by_type(module, source)
        if path is None or source != Held(path):
            # Not reached by its own path under the root (another module, or one handed on
            # by a piece before a graph break): by identity.
            self.guards.identity(source, module)
            self._remember(module, source)
        return module

    def _module_by_type(self, module: torch.nn.Module, source: Source) -> torch.nn.Module:
        """A module from outside the root whose forward the interpreter inlines
        (``read_by_type``), guarded as any other object: its exact type, and what the program
        reads of it as it reads it (attributes, parameters as graph inputs; when it is called,
        its hooks and that its instance has no forward of its own: ``GuardSet.hooks``);
        no native function may receive it (``unguarded``). One entry then serves every
        instance alike: layers that differ in their weights and an int index."""
        self.guards.exact_type(source, module)
        self._remember(module, source)
        self._objects.setdefault(source, module)
        self.unguarded.add(id(module))
        self.by_type.add(id(module))
        return module

    def _container(self, value: Any, source: Source) -> Any:
        if type(value) is dict:
            self.guards.keys(source, value)
            items = {key: self.read(item, Item(source, key)) for key, item in value.items()}
            same = all(items[key] is item for key, item in value.items())
            result: Any = value if same else items
        else:
            self.guards.length(source, value)
            read = [self.read(item, Item(source, index)) for index, item in enumerate(value)]
            same = all(new is old for new, old in zip(read, value))
            result = value if same else type(value)(read)
        self._remember(result, source)
        self.changes.copied(result, value)
        if result is not value or type(value) is not tuple:
            self._outside_containers.add(id(result))
        return result

    def remember_type(self, cls: type, of: Any) -> None:
        """``cls`` is ``type(of)``: it is read from there (``TypeOf``), so what the program
        reads off the class is guarded; a class already known by a source keeps it."""
        source = self.source_of(of)
        if source is not None:
            self._remember(cls, TypeOf(source))

    def _remember(self, value: Any, source: Source) -> None:
        self._sources.setdefault(id(value), source)
        self._alive.append(value)


# torch.nn leaf modules whose forward is Python over their own attributes and parameters,
# which the interpreter inlines where the module comes from outside the root, so that such a
# module is read by its type (``Recording._module_by_type``), not held by a ``call_module``
# node (a node holding one instance would need that instance, by identity, at every call).
# Other leaves (recurrent layers over flat weights, batch norm's running updates...) stay
# ``call_module`` nodes on the instance, guarded by identity.
INLINED_LEAVES = frozenset({
    torch.nn.Linear, torch.nn.Identity, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d,
    torch.nn.LayerNorm, torch.nn.GroupNorm, torch.nn.Embedding, torch.nn.Dropout,
    torch.nn.ReLU, torch.nn.GELU, torch.nn.SiLU, torch.nn.Tanh, torch.nn.Sigmoid,
    torch.nn.Softmax, torch.nn.LeakyReLU,
})  # fmt: skip


def _brought_by_the_call(source: Source) -> bool:
    """Whether ``source`` is reached from an argument (``layer``, ``layers[3].attn``): a module
    a call brings may be another at the next call. One the function finds in a global or a
    closure is the same at every call, where identity is one check and its parameters held
    (read by its type, every parameter would be a guarded input)."""
    while isinstance(source, Attr | Item):
        source = source.base
    return isinstance(source, Local)


def read_by_type(module: torch.nn.Module) -> bool:
    """Whether a ``module`` from outside the root is read by its type (see ``INLINED_LEAVES``):
    any module defined outside torch.nn (its forward is inlined), and the leaves listed."""
    from fxloom.values.leaf_modules import is_torch_nn_leaf

    return type(module) in INLINED_LEAVES or not is_torch_nn_leaf(module)


def _by_identity(values: dict[Source, Any]) -> tuple[dict[int, list[Source]], dict[int, Any]]:
    """The sources of each object (by id, in the order read), and the objects by id."""
    groups: dict[int, list[Source]] = {}
    objects: dict[int, Any] = {}
    for source, value in values.items():
        groups.setdefault(id(value), []).append(source)
        objects[id(value)] = value
    return groups, objects


# Functions, classes and modules read from a library module are not guarded
# (``callees.is_library_module``): rebinding ``torch.relu`` between calls is not something
# programs do.
_CODE = (types.FunctionType, types.BuiltinFunctionType, type, types.ModuleType)
_BOUND_C_METHODS = frozenset((types.BuiltinMethodType, types.MethodWrapperType))
# _LIBRARY_STATE: the objects a library's own code keeps in its module's globals (registries
# such as ``copy._copy_dispatch`` or transformers' output-capturing table), and what is
# reached from them, are taken as they are, without guards: like rebinding ``torch.relu``,
# changing them between calls is not something programs do. Constants read from them are
# still guarded by value. What user code reads from a library module (``os.environ``) is not
# library state: it is guarded like any other value.


# Functions that change the object they are given first, as the method they call on it.
_FUNCTION_FORMS = {
    builtins.setattr: "__setattr__", object.__setattr__: "__setattr__",
    operator.setitem: "__setitem__", operator.delitem: "__delitem__",
    **{getattr(operator, f"i{name}"): f"__i{name}__" for name in (
        "add", "and", "floordiv", "lshift", "matmul", "mod", "mul", "or", "pow", "rshift", "sub",
        "truediv", "xor")},
}  # fmt: skip
# Containers whose methods hash their first argument (a symbolic number there is fixed to its
# value by a guard: ``SEEN.add(n)``, ``table[n] = x``).
_HASHED = (dict, set)
# Objects whose changes ``changes`` tracks (``read`` hands back the program's view of them).
_CHANGEABLE = frozenset((list, dict, set, collections.deque, collections.OrderedDict))
# ``__setattr__`` that store into the instance (or the class, or a module's tables) as a read
# back expects: an attribute assigned through them is replayed as its final value.
_PLAIN_SETATTR = frozenset((object.__setattr__, type.__setattr__, torch.nn.Module.__setattr__))


def _own_setter(owner: Any, name: str) -> bool:
    """Whether assigning ``owner.name`` runs code of the program's own (a ``__setattr__`` or
    a property setter), whose effect only the assignment itself has."""
    cls = type(owner)
    if cls.__setattr__ not in _PLAIN_SETATTR:
        return True
    for klass in cls.__mro__:  # Python runs the data descriptors of the owner's type
        found = klass.__dict__.get(name)
        if found is not None:
            return hasattr(type(found), "__set__") and type(found) is not types.MemberDescriptorType
    return False


def _library_global(source: Global, value: Any) -> bool:
    """Whether global ``source`` is library state: a global of a library module (for the
    compiled function's own globals, whose module a ``Global`` does not name: the module that
    defines the value's type, when the value is that module's global of this name), and not
    one of the library objects that hold outside state (``callees.OUTSIDE_STATE``)."""
    if type(value) in OUTSIDE_STATE:
        return False
    module = source.module
    if module is None:
        module = type(value).__module__
        defining = sys.modules.get(module)
        if defining is None or getattr(defining, "__dict__", {}).get(source.name) is not value:
            return False
    return is_library_module(module)


# Dict keys a guard can spell (``Item``'s expression is the key's ``repr``).
_KEY_TYPES = frozenset((str, int, bool, type(None)))


# what a tensor input's guard checks, for the held parameters and buffers (strides apart)
_TENSOR_METADATA = operator.attrgetter("dtype", "device", "requires_grad", "shape")


# the dicts ``nn.Module.__getattr__`` looks a name up in, in its order
_MODULE_DICTS = ("_parameters", "_buffers", "_modules")


def _registrations(root: torch.nn.Module, paths) -> tuple[tuple, tuple, tuple]:
    """Each hop of each dotted path under ``root`` as (the dict that holds it, its name, the
    object it holds now), each hop once."""
    dicts, names, objects, seen = [], [], [], set()
    for path in paths:
        owner = root
        for name in path.split(".") if path else ():
            entries = next(
                held
                for held in map(vars(owner).get, _MODULE_DICTS)
                if held is not None and name in held
            )
            if (id(entries), name) not in seen:
                seen.add((id(entries), name))
                dicts.append(entries)
                names.append(name)
                objects.append(entries[name])
            owner = entries[name]
    return tuple(dicts), tuple(names), tuple(objects)


def _metadata(tensors: tuple) -> tuple[list, list]:
    # (C loops: about 1 us a tensor)
    return list(map(_TENSOR_METADATA, tensors)), list(map(torch.Tensor.stride, tensors))


def _constant_keys(value: dict) -> bool:
    return all(type(key) in _KEY_TYPES for key in value)
