"""Guards: what a compiled entry assumed, checked by one generated Python function per entry.

While the interpreter runs a function on its first call, every value it consults from
outside the function (``fxloom.bytecode.sources``) adds a guard: a tensor's type, dtype,
device, ``requires_grad`` and sizes; a Python constant's value; a module's, function's or
global's identity; a container's length or a dict's keys; the global state (grad mode,
inference mode, autocast, default dtype) in one check. Once the graph is recorded, how the
tensors read relate is guarded too (``Recording.guard_identities``): which are the same object
(``y is x``, ``x is not y``) and, where the graph writes, which share storage. ``GuardSet.compile`` turns them into
one straight-line function, cheapest checks first, which the cache calls before reusing the
entry::

    def guard(L_x, L_self):
        try:
            return (type(L_x) is K0 and L_self is K1 and L_x.dtype is K2 and ...)
        except Exception:           # a source that no longer resolves: not this entry
            return False

``GuardSet.first_failing`` re-checks them one by one to name the guard that failed, for
recompilation messages and ``explain()``.

Module structure is guarded by one integer: the *module epoch*, bumped by torch's global
hooks whenever any module registers a parameter, buffer or submodule (assigning
``model.fc = nn.Linear(...)`` included), so parameters need no per-value guard. Replacing
``param.data`` with a tensor of another shape is not seen; documented in docs/compile.md.

Depends on ``fxloom.bytecode.sources`` and torch.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from fxloom.bytecode.sources import Source, local_name

__all__ = [
    "Guard",
    "GuardSet",
    "disjoint_storage",
    "global_state",
    "module_epoch",
    "storage_key",
    "watch_modules",
]

# Cheapest first: identities and exact types, then tensor metadata, then values and lengths.
_IDENTITY, _TENSOR, _VALUE, _STRUCTURE = range(4)

_EPOCH = [0]


def _bump_epoch(*_: Any) -> None:
    _EPOCH[0] += 1


_WATCHING: list[bool] = []


def watch_modules() -> None:
    """Count module structure changes from now on (torch's global registration hooks; done
    by the first ``fxloom.compile``, so importing fxloom changes nothing in torch)."""
    if not _WATCHING:
        torch.nn.modules.module.register_module_parameter_registration_hook(_bump_epoch)
        torch.nn.modules.module.register_module_buffer_registration_hook(_bump_epoch)
        torch.nn.modules.module.register_module_module_registration_hook(_bump_epoch)
        _WATCHING.append(True)


def module_epoch() -> int:
    """How many times any module registered a parameter, buffer or submodule since
    ``watch_modules``."""
    return _EPOCH[0]


def global_state() -> tuple:
    """The global state a graph depends on: grad mode, inference mode, autocast, default dtype,
    deterministic algorithms. Compared as one tuple."""
    return (
        torch.is_grad_enabled(),
        torch.is_inference_mode_enabled(),
        torch._C._is_any_autocast_enabled(),
        torch.get_default_dtype(),
        torch.are_deterministic_algorithms_enabled(),
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

    def __init__(self) -> None:
        self._guards: dict[tuple[str, str], Guard] = {}
        self._constants: list[Any] = []
        self._constant_slots: dict[int, str] = {}
        self.add("global state", Guard(_IDENTITY, f"STATE() == {self.constant(global_state())}",
                                       f"{_GLOBAL_STATE_TEXT} as at compile time"))  # fmt: skip
        self.add("module epoch", Guard(_IDENTITY, f"EPOCH[0] == {module_epoch()}",
                                       "no module gained or replaced a parameter, buffer or submodule"))  # fmt: skip

    def __len__(self) -> int:
        return len(self._guards)

    def __iter__(self):
        return iter(sorted(self._guards.values(), key=lambda guard: guard.tier))

    # ------------------------------------------------------------ adding
    def add(self, key: str, guard: Guard) -> None:
        self._guards.setdefault((key, guard.check), guard)

    def constant(self, value: Any) -> str:
        """The name generated code reads ``value`` by (one slot per object)."""
        slot = self._constant_slots.get(id(value))
        if slot is None:
            slot = f"K{len(self._constants)}"
            self._constants.append(value)
            self._constant_slots[id(value)] = slot
        return slot

    def identity(self, source: Source, value: Any) -> None:
        self.add(source.expr, Guard(_IDENTITY, f"{source.expr} is {self.constant(value)}",
                                    f"{source.text} is the same {_kind(value)}"))  # fmt: skip

    def exact_type(self, source: Source, value: Any) -> None:
        cls = type(value)
        self.add(source.expr, Guard(_IDENTITY, f"type({source.expr}) is {self.constant(cls)}",
                                    f"type({source.text}) is {cls.__qualname__}"))  # fmt: skip

    def equals(self, source: Source, value: Any) -> None:
        """``value`` is a Python constant (None, bool, int, float, str, ... or a tuple of them)."""
        if value is None or value is True or value is False or value is Ellipsis:
            self.add(source.expr, Guard(_IDENTITY, f"{source.expr} is {value!r}",
                                        f"{source.text} is {value!r}"))  # fmt: skip
            return
        self.exact_type(source, value)
        check = f"{source.expr} == {self.constant(value)}"
        self.add(source.expr, Guard(_VALUE, check, f"{source.text} == {value!r}"))

    def tensor(self, source: Source, tensor: torch.Tensor) -> None:
        expr, text = source.expr, source.text
        self.exact_type(source, tensor)
        shape = self.constant(tensor.shape)
        checks = (
            f"{expr}.dtype is {self.constant(tensor.dtype)}",
            f"{expr}.device == {self.constant(tensor.device)}",
            f"{expr}.requires_grad is {tensor.requires_grad}",
            f"{expr}.shape == {shape}",
        )
        described = (
            f"{text}: dtype {tensor.dtype}, device {tensor.device}, "
            f"requires_grad={tensor.requires_grad}, shape {tuple(tensor.shape)}"
        )
        self.add(expr, Guard(_TENSOR, " and ".join(checks), described))

    # ------------------------------------------------------------ identity relations
    # Two sources of one tensor share one graph input, and the program's ``x is y`` was
    # decided on the objects it saw: which inputs are the same object is part of what the
    # entry assumed. Storage shared by different objects matters only where the graph writes
    # (``Recording.guard_identities``).
    def same_object(self, source: Source, other: Source) -> None:
        check = f"{source.expr} is {other.expr}"
        self.add(check, Guard(_IDENTITY, check, f"{source.text} is {other.text}"))

    def different_objects(self, sources: Sequence[Source]) -> None:
        """No two of ``sources`` are the same object (pairwise ``is not`` while that is
        cheaper than one set of ids)."""
        if len(sources) < 2:
            return
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
        check = f"id({source.expr}) not in {self.constant(held)}"
        text = f"{source.text} is none of the module's parameters and buffers the graph reads"
        self.add(check, Guard(_IDENTITY, check, text))

    def disjoint(self, sources: Sequence[Source]) -> None:
        """No two of the tensors at ``sources`` share a storage (``storage_key``)."""
        if len(sources) < 2:
            return
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
        interpreter inlined; backward hooks are refused before this is asked."""
        e = source.expr
        kinds = ("_forward_pre_hooks", "_forward_hooks", "_backward_hooks", "_backward_pre_hooks")
        now = tuple(tuple(getattr(module, kind)) for kind in kinds)
        if not any(now):
            check = " or ".join(f"{e}.{kind}" for kind in kinds)
            self.add(
                e + " hooks", Guard(_STRUCTURE, f"not ({check})", f"{source.text} has no hooks")
            )
            return
        check = f"({', '.join(f'tuple({e}.{kind})' for kind in kinds)}) == {self.constant(now)}"
        self.add(e + " hooks", Guard(_STRUCTURE, check, f"{source.text} has the same hooks"))

    # ------------------------------------------------------------ generating
    def source_code(self, parameters: Sequence[str]) -> str:
        """The generated guard function's source (also shown by ``compiled.code``)."""
        arguments = ", ".join(local_name(name) for name in parameters)
        checks = "\n                and ".join(guard.check for guard in self)
        return (
            f"def guard({arguments}):\n"
            "    try:\n"
            f"        return bool({checks})\n"
            "    except Exception:\n"
            "        return False\n"
        )

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
        namespace = self._namespace(globals_, closure, held)
        namespace.update(zip((local_name(name) for name in parameters), arguments))
        for guard in self:
            try:
                if not eval(guard.check, namespace):  # noqa: S307 - our own generated checks
                    return guard
            except Exception:
                return guard
        return None

    def _namespace(
        self, globals_: dict, closure: tuple | None, held: dict | None
    ) -> dict[str, Any]:
        namespace: dict[str, Any] = {
            "G": globals_,
            "C": closure or (),
            "EPOCH": _EPOCH,
            "R": held or {},
        }
        namespace["MODULES"] = sys.modules
        namespace["STATE"] = global_state
        namespace["STORAGE"] = storage_key
        namespace["DISJOINT"] = disjoint_storage
        namespace.update(zip((f"K{i}" for i in itertools.count()), self._constants))
        return namespace


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
