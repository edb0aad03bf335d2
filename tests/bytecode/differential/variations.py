"""Call sequences made from one base call: what a user varies between calls of one function.

``VARIATIONS`` maps a name to ``variation(base) -> [Call, ...]``, the calls that follow the
base call; ``sequence(base, names)`` is the base call then each named variation's calls. A
variation reuses the base's argument objects where it says so (the same tensors again, or
changed in place), so a case's deep copy keeps them one object per side. Every variation
applies to any signature: it acts on the tensors, ints and floats among the positional
arguments, and on the module's state through ``ADVANCE`` (one row per kind of value).
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from differential.harness import Call


def tensor(shape: tuple, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=generator).to(dtype)


def _positions(call: Call, kind: type) -> list[int]:
    return [i for i, value in enumerate(call.args) if type(value) is kind or (
        kind is torch.Tensor and isinstance(value, torch.Tensor))]  # fmt: skip


def _with(call: Call, label: str, changes: dict[int, Any], **fields: Any) -> Call:
    args = list(call.args)
    for index, value in changes.items():
        args[index] = value
    return replace(call, args=tuple(args), label=label, before=None, **fields)


def _remade(
    call: Call, label: str, make: Callable[[torch.Tensor], torch.Tensor], **fields: Any
) -> Call:
    changes = {i: make(call.args[i]) for i in _positions(call, torch.Tensor)}
    return _with(call, label, changes, **fields)


# ------------------------------------------------------------------ tensor variants
def _fresh(t: torch.Tensor, seed: int) -> torch.Tensor:
    return tensor(tuple(t.shape), seed, t.dtype)


def _grown(t: torch.Tensor) -> torch.Tensor:
    return tensor(tuple(size + 1 for size in t.shape), 7, t.dtype)


def _strided(t: torch.Tensor) -> torch.Tensor:
    """The same values, every other element of a wider tensor (not contiguous)."""
    if t.dim() == 0:
        return t.clone()
    wide = torch.zeros(*t.shape[:-1], t.shape[-1] * 2, dtype=t.dtype)
    wide[..., ::2] = t
    return wide[..., ::2]


def _transposed(t: torch.Tensor) -> torch.Tensor:
    """The same values laid out column-first (a transposed contiguous tensor)."""
    if t.dim() < 2:
        return t.clone()
    return t.transpose(0, -1).contiguous().transpose(0, -1)


def _view_of(base: torch.Tensor) -> torch.Tensor:
    """A view of ``base`` with its shape: the transpose where square, else ``view``."""
    if base.dim() == 2 and base.shape[0] == base.shape[1]:
        return base.t()
    return base.view(base.shape)


# ------------------------------------------------------------------ the variations
def again(base: Call) -> list[Call]:
    """Twice: a program that writes globals may compile once more, not on every call."""
    return [_with(base, "the same arguments again", {}), _with(base, "and again", {})]


def aliasing(base: Call) -> list[Call]:
    """Two tensor parameters given one tensor, then two, then one again."""
    slots = _positions(base, torch.Tensor)[:2]
    if len(slots) < 2:
        return []
    i, j = slots
    x = base.args[i]
    a, b = _fresh(x, 11), _fresh(base.args[j], 12)
    return [
        _with(base, "aliased: one tensor twice", {i: x, j: x}),
        _with(base, "distinct tensors", {i: a, j: b}),
        _with(base, "aliased again", {i: x, j: x}),
    ]


def view_and_base(base: Call) -> list[Call]:
    slots = _positions(base, torch.Tensor)[:2]
    if len(slots) < 2:
        return []
    i, j = slots
    x = base.args[i]
    return [
        _with(base, "a view and its base", {i: _view_of(x), j: x}),
        _with(base, "distinct tensors after the view", {j: _fresh(x, 13)}),
    ]


def state_advanced(base: Call) -> list[Call]:
    """The module's state advanced between calls (one call per global), then once more."""
    return [
        replace(base, label="every global advanced", before=advance_all),
        replace(base, label="every global advanced again", before=advance_all),
    ]


def numbers_changed(base: Call) -> list[Call]:
    ints, floats = _positions(base, int), _positions(base, float)
    if not ints and not floats:
        return []
    changed = {i: base.args[i] + 1 for i in ints} | {i: base.args[i] * 2 for i in floats}
    lowered = {i: max(base.args[i] - 1, 0) for i in ints} | {i: -base.args[i] for i in floats}
    return [
        _with(base, "ints +1, floats doubled", changed),
        _with(base, "ints -1, floats negated", lowered),
        _with(base, "the base numbers again", {}),
    ]


def ints_swept(base: Call) -> list[Call]:
    """Each int argument through 0..5 (a program raises on some)."""
    calls = []
    for i in _positions(base, int):
        calls += [_with(base, f"int argument {i} = {v}", {i: v}) for v in range(6)]
    return calls


def size_changed(base: Call) -> list[Call]:
    return [
        _remade(base, "every size +1", _grown),
        _with(base, "the base sizes again", {}),
    ]


def sizes_mismatched(base: Call) -> list[Call]:
    slots = _positions(base, torch.Tensor)
    if len(slots) < 2:
        return []
    return [
        _with(base, "one tensor grown, the others not", {slots[-1]: _grown(base.args[slots[-1]])})
    ]


def dtype_changed(base: Call) -> list[Call]:
    return [
        _remade(base, "float64 tensors", lambda t: t.double()),
        _with(base, "float32 again", {}),
    ]


def dtypes_mixed(base: Call) -> list[Call]:
    slots = _positions(base, torch.Tensor)
    return [_with(base, "one float64 tensor", {slots[0]: base.args[slots[0]].double()})]


def requires_grad_changed(base: Call) -> list[Call]:
    return [
        _remade(base, "tensors requiring grad", lambda t: t.detach().clone().requires_grad_()),
        _remade(
            base,
            "the same under no_grad",
            lambda t: t.detach().clone().requires_grad_(),
            grad=False,
        ),
    ]


def strides_changed(base: Call) -> list[Call]:
    return [
        _remade(base, "transposed layout (column-first)", _transposed),
        _remade(base, "non-contiguous (every other element)", _strided),
        _with(base, "contiguous again", {}),
    ]


def mutated_in_place(base: Call) -> list[Call]:
    return [
        replace(base, label="first tensor argument .add_(1) before the call", before=_add_one),
        replace(base, label="the same again", before=None),
    ]


def grad_mode_flipped(base: Call) -> list[Call]:
    return [
        _with(base, "under no_grad", {}, grad=False),
        _with(base, "grad enabled again", {}, grad=True),
    ]


def _add_one(namespace: dict, args: tuple, kwargs: dict) -> None:
    with torch.no_grad():
        next(a for a in args if isinstance(a, torch.Tensor)).add_(1)


VARIATIONS: dict[str, Callable[[Call], list[Call]]] = {
    "again": again,
    "aliasing": aliasing,
    "view and base": view_and_base,
    "state advanced": state_advanced,
    "numbers changed": numbers_changed,
    "ints swept": ints_swept,
    "size changed": size_changed,
    "sizes mismatched": sizes_mismatched,
    "dtype changed": dtype_changed,
    "dtypes mixed": dtypes_mixed,
    "requires_grad changed": requires_grad_changed,
    "strides changed": strides_changed,
    "mutated in place": mutated_in_place,
    "grad mode flipped": grad_mode_flipped,
}


def sequence(base: Call, names: list[str] | None = None) -> list[Call]:
    """The base call, then the calls of each named variation (all of them by default)."""
    calls = [replace(base, label=base.label or "base")]
    for name in names if names is not None else VARIATIONS:
        calls += VARIATIONS[name](base)
    return calls


# ------------------------------------------------------------------ advancing outside state
def _bump_first_number(container: Any, keys: Any) -> bool:
    for key in keys:
        if type(container[key]) in (int, float):
            container[key] += 1
            return True
    return False


def _advance_list(value: list) -> list:
    if not _bump_first_number(value, range(len(value))):
        value.append(len(value))
    return value


def _advance_dict(value: dict) -> dict:
    if not _bump_first_number(value, list(value)):
        value[f"key{len(value)}"] = len(value)
    return value


def _advance_set(value: set) -> set:
    value.symmetric_difference_update({"b"})
    return value


def _advance_enum(value: enum.Enum) -> enum.Enum:
    members = list(type(value))
    return members[(members.index(value) + 1) % len(members)]


def _advance_iterator(value: Any) -> Any:
    next(value, None)
    return value


def _advance_object(value: Any) -> Any:
    for key, item in list(vars(value).items()):
        if type(item) in (int, float, bool):
            setattr(value, key, ADVANCE[type(item)](item))
    return value


# exact type of a global -> its next value (containers and iterators changed in place)
ADVANCE: dict[type, Callable[[Any], Any]] = {
    bool: lambda v: not v,
    int: lambda v: v + 1,
    float: lambda v: v + 0.5,
    list: _advance_list,
    dict: _advance_dict,
    set: _advance_set,
    itertools.count: _advance_iterator,
}


def advance(value: Any) -> Any:
    """``value``'s next state (see ``ADVANCE``); Enum members, iterators and plain objects by
    their kind; anything else as it is."""
    step = ADVANCE.get(type(value))
    if step is not None:
        return step(value)
    if isinstance(value, enum.Enum):
        return _advance_enum(value)
    if hasattr(value, "__next__"):
        return _advance_iterator(value)
    if isinstance(value, type) and not issubclass(value, enum.Enum):
        return _advance_object(value)
    if hasattr(value, "__dict__") and not callable(value) and type(value).__module__ != "builtins":
        return _advance_object(value)
    return value


def advance_all(namespace: dict, args: tuple, kwargs: dict) -> None:
    """Advance every global of the program's module that is state (not a function or module)."""
    for name, value in list(namespace.items()):
        if name.isupper() or name[:1].isupper():
            namespace[name] = advance(value)
