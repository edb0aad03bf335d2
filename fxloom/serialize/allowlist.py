"""Which names a saved graph or a graph's text may use, and what they mean.

Loading a file or parsing a graph's text never imports a module the text
names and never calls what it has not found here. A name is resolved to an
object only if it is:

* in the closed table of ``call_table``: pure ATen/prims operator overloads,
  the listed torch functions and Tensor methods, ``operator``/``math``
  functions, safe builtins, fxloom's run-time functions, the torch classes that
  build values (``torch.Size``, ``torch.device``, dtype info, result types);
* an output class a graph rebuilds through its own constructor: a ``ModelOutput``
  dataclass of ``transformers`` whose fields have no default factory
  (``OUTPUT_CONTAINER_BASES``), looked up among modules already imported and the library
  modules ``LIBRARY_CLASS_MODULES`` enumerates (imported once the user imported the
  library). These
  are the only classes a graph may call besides the table's: a class runs code of
  its own when called (``collections.defaultdict``'s factory at a missing key);
* for tree specs and container values only, never as call targets
  (``resolve_container_class``): a container class registered with fxloom's or
  torch's pytree or listed in ``fxloom.library_containers`` (its caches), looked up the
  same way; the pytree registry says how to rebuild a
  container, not what a graph may call;
* an ``nn.Module`` class of ``torch.nn``, ``torch.ao.nn`` or fxloom, for the
  modules of a saved GraphModule;
* anything the user registered with ``register_serializable``.

Attribute reads are typed (``attribute_table``). Everything else is refused
with ``DisallowedNameError``, which names it and says how to allow it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import sys
from collections.abc import Iterator
from typing import Any

import torch

from fxloom import attr_path
from fxloom._format import qualified_name
from fxloom._namespace import is_plain_identifier
from fxloom.node import Node
from fxloom.ops.runtime_functions import runtime_function
from fxloom.serialize import attribute_table, call_table
from fxloom.serialize.errors import DisallowedNameError, SerializationError

__all__ = [
    "register_serializable",
    "registered",
    "resolve_callable",
    "resolve_container_class",
    "resolve_module_class",
    "OUTPUT_CONTAINER_BASES",
    "name_of",
    "module_class_name",
    "allowed_method",
    "check_call",
    "imported_class",
    "class_name",
    "MISSING",
]

MISSING = attr_path.MISSING

# Packages whose nn.Module classes may be rebuilt from a file (by state, never by pickle).
_MODULE_CLASS_PACKAGES = ("torch.nn.", "torch.ao.nn.", "fxloom.")
# Where the functions that talk to other processes live (rpc calls, their waits, collectives):
# saving refuses them with a reason of their own.
_REMOTE_CALLS = ("torch.distributed.", "fxloom.distributed.rpc.", "fxloom.passes.schedule.rpc_wait")

# Names users allowed, both ways.
_REGISTERED: dict[str, Any] = {}
_NAME_OF: dict[int, str] = {}


def register_serializable(obj: Any = None, *, name: str | None = None) -> Any:
    """Allow ``obj`` (a function, an ``nn.Module`` class, a container class) in saved files.

    Saving records it by ``name`` (default: its module and qualified name) and
    loading resolves that name to ``obj``; without registering, a file naming it
    is refused. Registering says you trust ``obj`` to be called (a module class:
    rebuilt from its attributes and state) on a file's values. Returns ``obj``,
    so it works as a decorator, with or without ``name``::

        @fxloom.register_serializable
        def scaled_gelu(x):
            return torch.nn.functional.gelu(x) * 1.7
    """
    if obj is None:
        return lambda target: register_serializable(target, name=name)
    if name is None:
        module = getattr(obj, "__module__", None)
        qualname = getattr(obj, "__qualname__", None)
        if not module or not qualname or "<locals>" in qualname:
            raise ValueError(
                f"{obj!r} has no importable name; register it with "
                "register_serializable(obj, name='mylib.name')"
            )
        name = f"{module}.{qualname}"
    existing = _REGISTERED.get(name)
    if existing is not None and existing is not obj:
        raise ValueError(f"the name {name!r} is already registered for {existing!r}")
    _REGISTERED[name] = obj
    _NAME_OF[id(obj)] = name
    return obj


def registered() -> dict[str, Any]:
    """The names users registered, and what they stand for (a copy)."""
    return dict(_REGISTERED)


# ------------------------------------------------------------------- loading
def resolve_callable(name: str, what: str = "target") -> Any:
    """The object ``name`` stands for, if it is allowed to be called; else ``DisallowedNameError``."""
    found = find_callable(name)
    if found is MISSING:
        raise DisallowedNameError(name, what)
    return found


def resolve_container_class(name: str, what: str = "container class") -> Any:
    """The container class ``name`` stands for, for rebuilding a tree spec or a container
    value (never for calling): a callable class, or one registered with a pytree."""
    found = find_callable(name)
    if found is MISSING and isinstance(name, str):
        found = _container_class(name)
    if found is MISSING:
        raise DisallowedNameError(name, what)
    return found


def find_callable(name: str) -> Any:
    """``resolve_callable`` without the error: ``MISSING`` where the name is not allowed."""
    if not isinstance(name, str):
        return MISSING
    if name in _REGISTERED:
        return _REGISTERED[name]
    found = _FOUND.get(name, MISSING)
    if found is MISSING:
        found = _find_allowed(name)
        if found is not MISSING:  # a refusal is not kept: the module may be imported later
            _FOUND[name] = found
    return found


# Names already resolved on the allowlist (a file names the same few hundred many times).
_FOUND: dict[str, Any] = {}


def _find_allowed(name: str) -> Any:
    found = call_table.find_table_callable(name)
    return found if found is not call_table.MISSING else _output_class(name)


# Bases of the classes a graph may call to build its output (besides call_table's).
OUTPUT_CONTAINER_BASES = frozenset({"transformers.utils.generic.ModelOutput"})


def _output_class(name: str) -> Any:
    """A library's output dataclass (``OUTPUT_CONTAINER_BASES``, defined in that library), whose
    constructor only stores its fields: no field has a default factory to call."""
    found = _container_class(name)
    if found is MISSING or not dataclasses.is_dataclass(found):
        return MISSING
    bases = {class_name(base) for base in found.__mro__}
    library = {base.partition(".")[0] for base in OUTPUT_CONTAINER_BASES & bases}
    if not library or found.__module__.partition(".")[0] not in library:
        return MISSING
    fields = dataclasses.fields(found)
    if any(field.default_factory is not dataclasses.MISSING for field in fields):
        return MISSING
    return found


def resolve_module_class(name: str) -> type:
    """The ``nn.Module`` class ``name`` stands for, if modules of it may be rebuilt."""
    if not isinstance(name, str):
        raise DisallowedNameError(repr(name), "module class")
    found = _REGISTERED.get(name, MISSING)
    if found is MISSING and name.startswith(_MODULE_CLASS_PACKAGES):
        found = _class_in_package(name)
    if not (isinstance(found, type) and issubclass(found, torch.nn.Module)):
        raise DisallowedNameError(name, "module class")
    return found


def allowed_method(name: str) -> bool:
    """A method a ``call_method`` node may call: a listed Tensor method or an operator's
    dunder (``call_table.allowed_tensor_method``), or one the user registered."""
    return isinstance(name, str) and name in _REGISTERED or call_table.allowed_tensor_method(name)


def check_call(target: Any, args: tuple, kwargs: dict | None = None) -> None:
    """Refuse what a call may not do although its target is allowed: read an attribute not
    in ``attribute_table`` (the name must be written in the graph: one computed while
    running, ``"__cl" + "ass__"``, could be any), or give a builtin a function to call."""
    if target in (getattr, hasattr) and len(args) >= 2:
        name = args[1]
        if not isinstance(name, str):
            raise SerializationError(
                f"{target.__name__} with an attribute name computed while running ({name!r}) is "
                "not allowed; only names written in the graph are"
            )
        if not attribute_table.readable_attribute(name):
            raise SerializationError(
                f"{target.__name__} of the attribute {name!r} is not allowed: graphs from files "
                "read only the attributes of tensors, sizes, dtypes, devices and registered "
                "containers (fxloom.serialize.attribute_table)"
            )
    row = runtime_function(target)
    for position in row.graph_arguments if row is not None else ():
        argument = args[position] if position < len(args) else None
        if not (isinstance(argument, Node) and argument.op == "get_attr"):
            raise SerializationError(
                f"{qualified_name(target)} calls its argument {position}, which must be a graph "
                f"of the file read by get_attr, not {argument!r}"
            )
    if isinstance(target, torch._ops.OpOverloadPacket):
        reason = call_table.packet_call_refusal(target, len(args), kwargs or {})
        if reason is not None:
            raise SerializationError(f"{reason}; name an allowed overload instead")
    refused = call_table.CALLABLE_KEYWORDS.get(target, frozenset()) & set(kwargs or ())
    if refused:
        raise SerializationError(
            f"{target.__name__}({', '.join(sorted(refused))}=...) is not allowed: it would call "
            "a function from the file"
        )


# -------------------------------------------------------------------- saving
def name_of(obj: Any, what: str = "target", *, container: bool = False) -> str:
    """The name ``obj`` is saved by; it must resolve back to ``obj`` when loading (as a call
    target, or with ``container``, as the class of a tree spec or container value).

    Raises ``SerializationError`` at save time for what a loader would refuse,
    so no file is written that cannot be loaded.
    """
    registered_name = _NAME_OF.get(id(obj))
    if registered_name is not None and _REGISTERED.get(registered_name) is obj:
        return registered_name
    name = class_name(obj) if isinstance(obj, type) else qualified_name(obj)
    found = find_callable(name)
    if found is MISSING and container:
        found = _container_class(name)
    if found is obj:
        return name
    if isinstance(obj, type) and not container and _container_class(name) is obj:
        raise SerializationError(
            f"cannot save {what} {name}: a graph from a file may call only the classes fxloom "
            "lists (torch.Size, torch.device, dtype info, result types, transformers' "
            "ModelOutput classes), since calling a class runs its code; if calling it is safe "
            f"on any arguments, register it with fxloom.register_serializable({obj.__qualname__})"
        )
    if isinstance(obj, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        reason = call_table.operator_refusal(obj) or "is not a listed operator"
        raise SerializationError(f"cannot save {what} {name}: loading refuses it, as it {reason}")
    if name.startswith(_REMOTE_CALLS):
        raise SerializationError(
            f"cannot save {what} {name}: it reaches other processes (torch.distributed), and "
            "loading a file never does unless you allow it. Save the model's state_dict and "
            "trace it again where it runs; or, if you trust the files you load to make these "
            "calls, register each function the graph calls (the rpc calls and the remote "
            "function) with fxloom.register_serializable"
        )
    raise SerializationError(
        f"cannot save {what} {name}: loading would refuse it, as it is not on fxloom's "
        f"allowlist. If it is safe to call, register it with fxloom.register_serializable({name.rsplit('.', 1)[-1]})"
    )


def module_class_name(cls: type) -> str:
    """The name a module of class ``cls`` is saved by (checked the way loading will)."""
    registered_name = _NAME_OF.get(id(cls))
    if registered_name is not None and _REGISTERED.get(registered_name) is cls:
        return registered_name
    name = class_name(cls)
    try:
        if resolve_module_class(name) is cls:
            return name
    except DisallowedNameError:
        pass
    raise SerializationError(
        f"cannot save a module of class {name}: it is not a torch.nn/torch.ao.nn/fxloom class, "
        f"so loading would refuse to rebuild it. If it is rebuilt correctly from its attributes "
        f"and state, register it with fxloom.register_serializable({cls.__qualname__})"
    )


# ------------------------------------------------------------------- helpers
def class_name(cls: type) -> str:
    """``module.qualname``: the name a class is saved by."""
    return f"{cls.__module__}.{cls.__qualname__}"


def _container_class(name: str) -> Any:
    """A class registered as a pytree container (with fxloom's or torch's pytree, or listed in
    ``fxloom.library_containers``), in a module already imported or one of the library
    modules ``LIBRARY_CLASS_MODULES`` lists."""
    found = library_class(name)
    if found is MISSING:
        return MISSING
    import torch.utils._pytree as torch_pytree

    from fxloom.pytree import registered_container

    registered = registered_container(found) is not None or found in torch_pytree.SUPPORTED_NODES
    return found if registered else MISSING


# The modules that define the output and cache classes a saved graph of a library's model
# holds, by library: a file's class name makes fxloom import one of them only when the name's
# module is listed here and the user imported the library itself (``import transformers``,
# lazy, is enough). A module the table does not list is never imported, whatever the file
# names: a model's own output class (``modeling_clip.CLIPOutput``) is found once the user
# imported the model class (``from transformers import CLIPModel`` imports its module).
LIBRARY_CLASS_MODULES: dict[str, frozenset[str]] = {
    "transformers": frozenset({
        "transformers.modeling_outputs",
        "transformers.cache_utils",
        "transformers.utils.generic",
        "transformers.generation.utils",
    }),
}  # fmt: skip


def library_class(name: str) -> Any:
    """``imported_class``, after importing the name's module when ``LIBRARY_CLASS_MODULES``
    lists it and its library is imported (never a module the table does not name)."""
    found = imported_class(name)
    if found is not MISSING or not isinstance(name, str):
        return found
    module_name = name.rpartition(".")[0]
    library = module_name.partition(".")[0]
    if library not in sys.modules or module_name not in LIBRARY_CLASS_MODULES.get(library, ()):
        return MISSING
    return _imported_then_found(name, module_name)


def _imported_then_found(name: str, module_name: str) -> Any:
    """``imported_class(name)`` once ``module_name`` (one the caller allowed) is imported."""
    try:
        importlib.import_module(module_name)
    except ImportError:
        return MISSING
    return imported_class(name)


def imported_class(name: str) -> Any:
    """The class at ``module.qualname`` among imported modules, read without running any code."""
    module_name, _, qualname = name.rpartition(".")
    while module_name and module_name not in sys.modules:
        module_name, _, head = module_name.rpartition(".")
        qualname = f"{head}.{qualname}"
    module = sys.modules.get(module_name)
    if module is None:
        return MISSING
    found: Any = module
    for part in qualname.split("."):
        found = vars(found).get(part, MISSING) if hasattr(found, "__dict__") else MISSING
        if found is MISSING:
            return MISSING
    return found if isinstance(found, type) and class_name(found) == name else MISSING


def _importable(module_name: str, packages: tuple[str, ...]) -> bool:
    """Whether a file may make us import ``module_name``: a module of one of ``packages``
    spelled as plain identifiers, and never a ``__main__`` (importing it runs a program)."""
    parts = module_name.split(".")
    return any(module_name == p or module_name.startswith(p + ".") for p in packages) and all(
        is_plain_identifier(part) and not part.startswith("__") for part in parts
    )


def _class_in_package(name: str) -> Any:
    """A class of torch.nn, torch.ao.nn or fxloom (their modules may be imported: they are ours)."""
    found = imported_class(name)
    if found is not MISSING:
        return found
    module_name, _, qualname = name.rpartition(".")
    packages = tuple(p.rstrip(".") for p in _MODULE_CLASS_PACKAGES)
    if "." in qualname or not _importable(module_name, packages):
        return MISSING
    return _imported_then_found(name, module_name)


@contextlib.contextmanager
def names_standing_in(placeholders: dict[str, Any]) -> Iterator[None]:
    """Within the block, each name of ``placeholders`` resolves to its placeholder object.

    For describing a file without loading it (``fxloom show``, ``refused_names``): the graph
    is decoded with inert objects where loading would refuse a name. The registry is as it
    was afterwards, on every path; a loaded module never holds a placeholder.
    """
    saved = dict(_REGISTERED), dict(_NAME_OF)
    try:
        for name, placeholder in placeholders.items():
            _REGISTERED[name] = placeholder
            _NAME_OF[id(placeholder)] = name
        yield
    finally:
        _REGISTERED.clear()
        _REGISTERED.update(saved[0])
        _NAME_OF.clear()
        _NAME_OF.update(saved[1])
