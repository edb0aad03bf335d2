"""One compilation's state: what was read from outside (with guards), the graph, what was built.

The interpreter holds real Python values; ``Recording`` knows, for the ones that came from
outside the compiled function, where they came from (``source_of``), and turns every read
from outside into a value the program can use plus the guards that make reusing the result
safe (``read``):

==========================  ======================================  ===========================
value read                  what the program gets                   guard
==========================  ======================================  ===========================
None, bool, int, float, str the value itself                        equal (and same type)
tensor                      a stand-in, a graph input               type, dtype, device, grad,
                                                                    shape
parameter or buffer of the  a stand-in, a graph input read at call  none (the module epoch)
root module                 time
submodule of the root       the module itself                       none (the module epoch)
function, class, module,    the value itself                        identity
other module
list, tuple, dict           the same container, or a copy holding   type and length (dict:
                            stand-ins for its tensors               keys); items read as above
any other object            the object itself                       exact type; attributes as
                                                                    they are read
==========================  ======================================  ===========================

The tensors read are guarded together as well, after the graph is recorded
(``guard_identities``): which sources hold the same object, and, where the graph writes,
which share storage. Objects the program builds (``created``) need no guard. Assigning an attribute of an object
from outside is a side effect: it is kept aside (``write_attribute``; later reads see it) and
the compiled entry replays it after its graph; other changes to outside objects (a list
append, a dict item) are a break for now.

Depends on ``fxloom.bytecode.guards``, ``graph_builder``, ``sources`` and torch.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import torch

from fxloom.bytecode.breaks import Break
from fxloom.bytecode.graph_builder import GraphBuilder
from fxloom.bytecode.guards import GuardSet, storage_key
from fxloom.bytecode.sources import Attr, Held, Item, Local, Source

__all__ = ["Recording", "CONSTANT_TYPES", "NOT_WRITTEN"]

NOT_WRITTEN = object()

CONSTANT_TYPES = frozenset(
    (type(None), bool, int, float, complex, str, bytes, type(Ellipsis), type(NotImplemented))
)
# Compared by equality: values of these types are immutable descriptions.
_EQUAL_TYPES = frozenset(
    (torch.device, torch.Size, slice, range, torch.memory_format, torch.layout)
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
        self.created: set[int] = set()  # ids of objects the program built
        self._sources: dict[int, Source] = {}
        # (id(owner), name) -> (owner, name, value): attributes of outside objects assigned
        self.writes: dict[tuple[int, str], tuple[Any, str, Any]] = {}
        # (function, args, kwargs): Python output (print, logging, warnings) run after the graph
        self.deferred: list[tuple[Any, tuple, dict]] = []
        self._alive: list[Any] = []
        # Every source an outside object (not a constant, container, module or function) was
        # read from: objects whose attributes the program assigns are guarded by identity.
        self._objects: dict[Source, Any] = {}
        # Containers from outside and the copies made of them: changing one is a break.
        self._outside_containers: set[int] = set()
        self._root_paths: dict[int, str] = {}  # id(submodule, parameter or buffer) -> path
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

    # ------------------------------------------------------------ attribute writes
    def write_attribute(self, owner: Any, name: str, value: Any) -> None:
        """``owner.name = value`` on an object from outside: kept aside (later reads see it)
        and replayed by the compiled entry after its graph runs."""
        if self.source_of(owner) is None:
            raise Break(
                "outside-mutation",
                f"{name} of a {type(owner).__name__} reached by no source is assigned",
            )
        self.writes[(id(owner), name)] = (owner, name, value)

    def written(self, owner: Any, name: str) -> Any:
        """The value the program assigned to ``owner.name`` so far, or ``NOT_WRITTEN``."""
        found = self.writes.get((id(owner), name))
        return NOT_WRITTEN if found is None else found[2]

    # ------------------------------------------------------------ reading
    def read(self, value: Any, source: Source | None) -> Any:
        """``value``, read from ``source``, as the program sees it; see the module docstring."""
        kind = type(value)
        if source is None:
            return self.graph.adopt(value)
        if kind in CONSTANT_TYPES:
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
            self.read(value.__func__, Attr(source, "__func__"))
            self.read(value.__self__, Attr(source, "__self__"))
            return value
        if isinstance(value, _IDENTITY_TYPES) or kind in _EQUAL_TYPES:
            if kind in _EQUAL_TYPES:
                self.guards.equals(source, value)
            else:
                self.guards.identity(source, value)
            self._remember(value, source)
            return value
        if kind is list or kind is tuple or kind is dict:
            return self._container(value, source)
        self.guards.exact_type(source, value)
        self._remember(value, source)
        self._objects.setdefault(source, value)
        return value

    def read_attribute(self, owner: Any, name: str, value: Any) -> Any:
        """``owner.name`` (already read natively as ``value``) as the program sees it."""
        if id(owner) in self.created:
            return self.graph.adopt(value)
        source = self.source_of(owner)
        if source is None:
            return self.graph.adopt(value)
        if type(owner) is types.ModuleType and _is_library(owner) and isinstance(value, _CODE):
            self._remember(value, Attr(source, name))  # library code is taken as it is
            return value
        if isinstance(value, torch.Tensor | torch.nn.Module) and self.root_source is not None:
            path = self._root_paths.get(id(value))
            if path is not None:
                return self.read(value, Held(path))
        return self.read(value, Attr(source, name))

    def read_item(self, container: Any, key: Any, value: Any) -> Any:
        """``container[key]`` for a constant ``key``, as the program sees it."""
        if id(container) in self.created:
            return self.graph.adopt(value)
        source = self.source_of(container)
        return self.read(value, None if source is None else Item(source, key))

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
        self.guards.tensor(source, tensor)
        return self.graph.input(source, tensor)

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
        if path is None or source != Held(path):
            # Not reached by its own path under the root (another module, or one handed on
            # by a piece before a graph break): by identity.
            self.guards.identity(source, module)
            self._remember(module, source)
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
        if result is not value or type(value) is not tuple:
            self._outside_containers.add(id(result))
        return result

    def _remember(self, value: Any, source: Source) -> None:
        self._sources.setdefault(id(value), source)
        self._alive.append(value)


def _by_identity(values: dict[Source, Any]) -> tuple[dict[int, list[Source]], dict[int, Any]]:
    """The sources of each object (by id, in the order read), and the objects by id."""
    groups: dict[int, list[Source]] = {}
    objects: dict[int, Any] = {}
    for source, value in values.items():
        groups.setdefault(id(value), []).append(source)
        objects[id(value)] = value
    return groups, objects


# Functions, classes and modules of these packages are not guarded when read from their
# module: rebinding ``torch.relu`` between calls is not something programs do.
_LIBRARIES = frozenset(sys.stdlib_module_names) | {"torch", "transformers", "numpy", "fxloom"}
_CODE = (types.FunctionType, types.BuiltinFunctionType, type, types.ModuleType)


def _is_library(module: types.ModuleType) -> bool:
    return module.__name__.partition(".")[0] in _LIBRARIES
