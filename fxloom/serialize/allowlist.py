"""Which names a saved graph or a graph's text may use, and what they mean.

Loading a file or parsing a graph's text never imports a module the text
names and never calls what it has not found here. A name is resolved to an
object only if it is:

* a safe builtin (``getattr``, ``len``, ``max``; never ``eval``, ``open``,
  ``__import__``);
* a public callable of ``operator``, ``math`` or one of torch's function
  namespaces (``torch``, ``torch.nn.functional``, ``torch.special``, ...),
  which must be what prints as that name (no ``os.system`` reached as
  ``torch.os.system``), minus the few that touch files or compile code;
* a registered operator ``torch.ops.<namespace>.<op>[.<overload>]``;
* one of fxloom's own functions that traced graphs call (guards, ``cond``);
* a container class registered with fxloom's or torch's pytree (Hugging Face's
  ``ModelOutput`` classes), looked up only among modules already imported;
* an ``nn.Module`` class of ``torch.nn``, ``torch.ao.nn`` or fxloom, for the
  modules of a saved GraphModule;
* anything the user registered with ``register_serializable``.

Everything else is refused with ``DisallowedNameError``, which names it and
says how to allow it.
"""

from __future__ import annotations

import builtins
import importlib
import math
import operator
import sys
from typing import Any

import torch

from fxloom import attr_path
from fxloom._format import qualified_name
from fxloom.serialize.errors import DisallowedNameError, SerializationError

__all__ = [
    "register_serializable",
    "registered",
    "resolve_callable",
    "resolve_module_class",
    "name_of",
    "module_class_name",
    "allowed_method",
    "check_call",
    "imported_class",
    "class_name",
    "MISSING",
]

MISSING = attr_path.MISSING

# Builtins a graph may call; eval, exec, open, __import__, setattr, type... are not among them.
_SAFE_BUILTINS = frozenset(
    "getattr len int float bool str tuple list dict slice range min max abs sum "
    "isinstance hasattr round divmod pow all any zip enumerate reversed sorted".split()
)
_ALLOWED_ROOTS: dict[str, Any] = {"torch": torch, "operator": operator, "math": math}
_ALLOWED_MODULE_PREFIXES = ("torch", "operator", "_operator", "math")
# torch namespaces whose functions may be targets (``torch.relu``, ``torch.nn.functional.gelu``).
_TORCH_PARENTS = frozenset(
    {
        "torch",
        "torch.nn.functional",
        "torch._C._nn",
        "torch._C._fft",  # torch.fft.fft prints as torch._C._fft.fft_fft
        "torch._C._linalg",
        "torch._C._special",
        "torch.special",
        "torch.linalg",
        "torch.fft",
        "torch.return_types",
    }
)
# Functions that touch files or compile code; ``operator.call``/``methodcaller``/``attrgetter``
# would call or reach anything by name.
_DENIED = frozenset(
    {"torch.load", "torch.save", "torch.from_file", "torch.compile"}
    | {"operator.call", "operator.methodcaller", "operator.attrgetter"}
)
# Attributes of frames, generators, coroutines, tracebacks and classes that lead to globals and
# builtins without a dunder (``gen.gi_frame.f_globals``); no graph reads them.
_INTROSPECTION_ATTRIBUTES = frozenset(
    "gi_frame gi_code gi_yieldfrom cr_frame cr_code cr_await ag_frame ag_code "
    "f_globals f_locals f_builtins f_back f_code tb_frame tb_next func_globals func_code "
    "mro".split()
)
# fxloom modules whose functions graphs that fxloom produces may call.
_FXLOOM_FUNCTION_MODULES = (
    "fxloom.guards",
    "fxloom.cond",
    "fxloom.pytree",
    "fxloom.ops",
    "fxloom.export",
)
# Packages whose nn.Module classes may be rebuilt from a file (by state, never by pickle).
_MODULE_CLASS_PACKAGES = ("torch.nn.", "torch.ao.nn.", "fxloom.")

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
    parts = name.split(".")
    if len(parts) == 1 or parts[0] == "builtins" and len(parts) == 2:
        return getattr(builtins, parts[-1]) if parts[-1] in _SAFE_BUILTINS else MISSING
    if parts[:2] == ["torch", "ops"]:
        return _op_overload(parts[2:])
    if parts[0] == "fxloom":
        found = _fxloom_function(name)
        return found if found is not MISSING else _container_class(name)
    found = _library_callable(name, parts)
    if found is not MISSING:
        return found
    return _container_class(name)


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
    """A Tensor method a ``call_method`` node may call: defined by Tensor, and no dunder
    other than an operator's (``__getitem__``, ``__radd__``)."""
    if not isinstance(name, str):
        return False
    if name in _REGISTERED:
        return True
    if not (name in vars(torch.Tensor) or name in vars(torch._C.TensorBase)):
        return False
    if not (name.startswith("__") and name.endswith("__")):
        return True
    bare = name[2:-2]
    # vars, not hasattr: every module has object's __reduce_ex__ and __setattr__.
    return any(f"__{b}__" in vars(operator) for b in (bare, bare[1:]) if b)


def check_call(target: Any, args: tuple) -> None:
    """Refuse ``getattr(x, "__globals__")``-style reaches: a dunder attribute, or a frame's or
    generator's internals (``gi_frame.f_globals``), reaches everything. The name must be
    written in the graph: one computed while running (``"__cl" + "ass__"``) could be any."""
    if target not in (getattr, hasattr) or len(args) < 2:
        return
    name = args[1]
    if not isinstance(name, str):
        raise SerializationError(
            f"{target.__name__} with an attribute name computed while running ({name!r}) is "
            "not allowed; only names written in the graph are"
        )
    if _is_dunder(name) or name in _INTROSPECTION_ATTRIBUTES or name.startswith("co_"):
        raise SerializationError(
            f"{target.__name__} of the private attribute {name!r} is not allowed"
        )


# -------------------------------------------------------------------- saving
def name_of(obj: Any, what: str = "target") -> str:
    """The name ``obj`` is saved by; it must resolve back to ``obj`` when loading.

    Raises ``SerializationError`` at save time for what a loader would refuse,
    so no file is written that cannot be loaded.
    """
    registered_name = _NAME_OF.get(id(obj))
    if registered_name is not None and _REGISTERED.get(registered_name) is obj:
        return registered_name
    name = class_name(obj) if isinstance(obj, type) else qualified_name(obj)
    if find_callable(name) is obj:
        return name
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


def _is_dunder(value: Any) -> bool:
    return isinstance(value, str) and value.startswith("__") and value.endswith("__")


def _library_callable(name: str, parts: list[str]) -> Any:
    root = _ALLOWED_ROOTS.get(parts[0])
    if root is None or name in _DENIED:
        return MISSING
    if root is torch and ".".join(parts[:-1]) not in _TORCH_PARENTS:
        return MISSING
    found = attr_path.find(root, ".".join(parts[1:])) if len(parts) > 1 else root
    if found is MISSING or not callable(found) or isinstance(found, type(torch)):
        return MISSING
    module = getattr(found, "__module__", None) or ""
    if not module.startswith(_ALLOWED_MODULE_PREFIXES) and not isinstance(found, type):
        return MISSING
    # The object must be what prints as this name: no reaching os.system via torch.os.
    return found if qualified_name(found) == name else MISSING


def _op_overload(parts: list[str]) -> Any:
    """``torch.ops.<ns>.<op>[.<overload>]``: only registered operators, never other attributes."""
    if len(parts) not in (2, 3) or any(p.startswith("__") for p in parts):
        return MISSING
    try:
        found = attr_path.find(torch.ops, ".".join(parts))
    except (AttributeError, RuntimeError):
        return MISSING
    return (
        found
        if isinstance(found, (torch._ops.OpOverload, torch._ops.OpOverloadPacket))
        else MISSING
    )


def _fxloom_function(name: str) -> Any:
    module_name, _, attr = name.rpartition(".")
    if not _importable(module_name, _FXLOOM_FUNCTION_MODULES):
        return MISSING
    try:
        module = importlib.import_module(module_name)  # fxloom's own modules only
    except ImportError:
        return MISSING
    found = vars(module).get(attr, MISSING)
    return found if callable(found) and qualified_name(found) == name else MISSING


def _container_class(name: str) -> Any:
    """A class registered as a pytree container, in a module already imported (never imports)."""
    found = imported_class(name)
    if found is MISSING:
        return MISSING
    import torch.utils._pytree as torch_pytree

    from fxloom.pytree import _REGISTRY

    return found if found in _REGISTRY or found in torch_pytree.SUPPORTED_NODES else MISSING


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
        part.isidentifier() and not part.startswith("__") for part in parts
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
    try:
        importlib.import_module(module_name)
    except ImportError:
        return MISSING
    return imported_class(name)
