"""What an operator does to its inputs, and how export says the same without mutation.

Every ATen operator's schema says whether it writes an argument (``Tensor(a!)``)
or returns a view of one (``Tensor(a)``). ``classify`` reads that once per
operator and answers with an ``OpKind``:

* ``functional``: reads its inputs, returns new values (``aten.add.Tensor``);
* ``view``: returns values sharing ``self``'s memory (``aten.slice.Tensor``,
  ``aten.unbind.int``); recorded as is, and remembered, so a later write
  through the view can be carried back to its base;
* ``inplace`` / ``out``: writes ``self`` (``add_``) or ``out=`` arguments;
  recorded as the functional form (``aten.add.Tensor``) whose result becomes
  the written tensor's new value;
* ``mutable``: writes other arguments (``_batch_norm_with_update`` writes the
  running statistics); recorded as its ``_functional`` twin, which returns
  the new values after the usual results;
* ``metadata``: makes a tensor another view of its memory (``unsqueeze_``,
  ``as_strided_``); recorded as the view (``unsqueeze``), which the tensor
  becomes;
* ``data_dependent``: its result's size or value comes from data (``nonzero``,
  ``.item()``): described with new symbols (``data_dependent.DATA_DEPENDENT_RULES``);
* ``refused``: gives a tensor other memory (``resize_``) or needs data with no
  rule to describe the result without it (``torch.equal``).

A write through a view must update the view's base: ``SCATTERS`` says, for each
view operator, how to put a new value for the view back into the base
(``slice`` -> ``slice_scatter``, ``transpose`` -> ``transpose`` back, ...).
Extend it for other view operators.

Depends on nothing of fxloom.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from fxloom.ops.identity import functional_overload
from fxloom.ops.mutation import schema_is_view
from fxloom.values.symbolic.data_dependent import DATA_DEPENDENT_RULES

__all__ = [
    "OpKind",
    "classify",
    "SCATTERS",
    "UNARY_INVERSES",
    "ViewStep",
    "FUNCTIONAL_TWINS",
    "UnsupportedOpError",
]

aten = torch.ops.aten


class UnsupportedOpError(RuntimeError):
    """An operator export cannot turn into the functional form the exported graph needs."""


@dataclass(frozen=True)
class OpKind:
    """How an operator touches its inputs; see the module docstring."""

    kind: str  # functional | view | inplace | out | mutable | metadata | data_dependent | refused
    functional: Any = None  # the operator recorded instead (inplace, out, mutable)
    written: tuple[str, ...] = ()  # names of the arguments it writes
    reason: str = ""  # why it is refused
    # mutable only: whether this call writes (given args, kwargs); when it does not, the
    # functional call to record instead: (args, kwargs) -> (operator, args, kwargs)
    writes: Callable[[tuple, dict], bool] | None = None
    otherwise: Callable[[tuple, dict], tuple[Any, tuple, dict]] | None = None


# In-place or mutating operators whose functional form is not found by the naming rules.
FUNCTIONAL_TWINS: dict[Any, Any] = {
    aten.normal_.default: aten.normal_functional.default,
    aten.zero_.default: aten.zero.default,
    aten.detach_.default: aten.detach.default,
}

# Operators that need a value's data and have no rule for describing their result without it
# (those with one, ``nonzero`` or ``.item()``, are in ``data_dependent.DATA_DEPENDENT_RULES``).
_DATA_DEPENDENT = {
    aten.equal.default: "torch.equal",
}


_BATCH_NORM_ARGS = (
    "input", "weight", "bias", "running_mean", "running_var", "training", "momentum", "eps"
)  # fmt: skip


def _batch_norm_bound(args: tuple, kwargs: dict) -> dict[str, Any]:
    return dict(zip(_BATCH_NORM_ARGS, args)) | kwargs


def _updates_statistics(args: tuple, kwargs: dict) -> bool:
    bound = _batch_norm_bound(args, kwargs)
    return bool(bound.get("training")) and bound.get("running_mean") is not None


def _batch_norm_without_update(args: tuple, kwargs: dict) -> tuple[Any, tuple, dict]:
    """native_batch_norm when it writes nothing: in eval mode the no-training operator, in
    training mode without running statistics the no-statistics one."""
    b = _batch_norm_bound(args, kwargs)
    if not b.get("training"):
        inputs = (b["input"], b["weight"], b["bias"], b["running_mean"], b["running_var"])
        return (
            aten._native_batch_norm_legit_no_training.default,
            (*inputs, b["momentum"], b["eps"]),
            {},
        )
    inputs = (b["input"], b["weight"], b["bias"], True, b["momentum"], b["eps"])
    return aten._native_batch_norm_legit.no_stats, inputs, {}


# Operators whose schema does not say what they write: native_batch_norm updates the running
# statistics in training mode (when it has them).
UNDECLARED_WRITES: dict[Any, OpKind] = {
    aten.native_batch_norm.default: OpKind(
        "mutable",
        aten._native_batch_norm_legit_functional.default,
        ("running_mean", "running_var"),
        writes=_updates_statistics,
        otherwise=_batch_norm_without_update,
    ),
}

_cache: dict[Any, OpKind] = {}


def classify(func: Any) -> OpKind:
    """The ``OpKind`` of an operator overload (cached)."""
    found = _cache.get(func)
    if found is None:
        found = _cache[func] = _classify(func)
    return found


def _classify(func: Any) -> OpKind:
    if func in UNDECLARED_WRITES:
        return UNDECLARED_WRITES[func]
    if func in DATA_DEPENDENT_RULES:
        return OpKind("data_dependent")
    if func in _DATA_DEPENDENT:
        return OpKind("refused", reason=f"needs the data of a tensor ({_DATA_DEPENDENT[func]})")
    schema = func._schema
    written = tuple(a.name for a in schema.arguments if a.alias_info and a.alias_info.is_write)
    if not written:
        return OpKind("view" if schema_is_view(func) else "functional")
    twin = FUNCTIONAL_TWINS.get(func)
    if all(_is_out(a) for a in schema.arguments if a.name in written):
        return OpKind("out", twin or _out_twin(func), written)
    if written == ("self",) and func._opname.endswith("_"):
        if func._opname in _METADATA_INPLACE:
            return OpKind("metadata", twin or _inplace_twin(func), written)
        if func._opname in _STORAGE_INPLACE:
            return OpKind(
                "refused",
                reason=f"replaces a tensor's memory in place; use an out-of-place form "
                f"(x = x.new_empty(...) or torch.cat) instead of x.{func._opname}(...)",
            )
        return OpKind("inplace", twin or _inplace_twin(func), written)
    return OpKind("mutable", twin or _mutable_twin(func), written)


# In-place operators that make a tensor another view of its memory (shape, strides), leaving
# the data alone: recorded as the view, which the tensor becomes.
_METADATA_INPLACE = frozenset(
    {"t_", "transpose_", "unsqueeze_", "squeeze_", "swapdims_", "swapaxes_", "as_strided_"}
)
# In-place operators that give a tensor other memory.
_STORAGE_INPLACE = frozenset({"resize_", "resize_as_", "set_"})


def _is_out(argument: Any) -> bool:
    return argument.kwarg_only and argument.alias_info is not None


def _packet(name: str) -> Any:
    return getattr(aten, name, None)


def _inplace_twin(func: Any) -> Any:
    """``aten.add_.Tensor`` -> ``aten.add.Tensor`` (``fxloom.ops.identity.functional_overload``)."""
    twin = functional_overload(func)
    if twin is None:
        raise UnsupportedOpError(f"{func} writes its input and has no functional form export knows")
    return twin


def _out_twin(func: Any) -> Any:
    """``aten.add.out`` -> the overload of ``add`` taking the same arguments without ``out=``."""
    schema = func._schema
    wanted = [(a.name, str(a.type)) for a in schema.arguments if not _is_out(a)]
    packet = _packet(func._opname)
    for name in packet.overloads() if packet is not None else ():
        candidate = getattr(packet, name)
        args = candidate._schema.arguments
        if not candidate._schema.is_mutable and [(a.name, str(a.type)) for a in args] == wanted:
            return candidate
    raise UnsupportedOpError(f"{func} writes its out= argument and has no functional form")


def _mutable_twin(func: Any) -> Any:
    """``aten.X`` writing some arguments -> ``aten.X_functional``, returning their new values too."""
    for name in (f"{func._opname}_functional", f"_{func._opname}_functional"):
        packet = _packet(name)
        if packet is not None:
            overload = func._overloadname
            return getattr(packet, overload if overload in packet.overloads() else "default")
    raise UnsupportedOpError(
        f"{func} writes its arguments {func._schema.arguments} and has no functional form"
    )


# ----------------------------------------------------------------- views and their inverses


@dataclass(frozen=True)
class ViewStep:
    """One view operator applied to a base: ``func(base, *args, **kwargs)[index]``."""

    func: Any
    args: tuple
    kwargs: dict
    index: int | None = None  # which output, for operators returning several views


# A scatter: (step, base's meta tensor) -> (operator, args after (base, src)) that writes
# ``src`` into the base where the view ``step`` reads; or None: the view covers the whole
# base, reshaped, and ``reshape_back`` applies instead.
Scatter = Callable[[ViewStep, torch.Tensor], "tuple[Any, tuple] | None"]


def _bound(step: ViewStep, *names_defaults: tuple[str, Any]) -> list[Any]:
    """The step's arguments after ``self`` by name, with the schema's defaults filled in."""
    values = list(step.args)
    for name, default in names_defaults[len(values) :]:
        values.append(step.kwargs.get(name, default))
    return values


def _slice(step: ViewStep, base: torch.Tensor) -> tuple[Any, tuple]:
    dim, start, end, stride = _bound(step, ("dim", 0), ("start", None), ("end", None), ("step", 1))
    return aten.slice_scatter.default, (dim, start, end, stride)


def _select(step: ViewStep, base: torch.Tensor) -> tuple[Any, tuple]:
    return aten.select_scatter.default, tuple(_bound(step, ("dim", 0), ("index", 0)))


def _diagonal(step: ViewStep, base: torch.Tensor) -> tuple[Any, tuple]:
    bound = _bound(step, ("offset", 0), ("dim1", 0), ("dim2", 1))
    return aten.diagonal_scatter.default, tuple(bound)


def _as_strided(step: ViewStep, base: torch.Tensor) -> tuple[Any, tuple]:
    bound = _bound(step, ("size", None), ("stride", None), ("storage_offset", None))
    return aten.as_strided_scatter.default, tuple(bound)


def _unbind(step: ViewStep, base: torch.Tensor) -> tuple[Any, tuple]:
    (dim,) = _bound(step, ("dim", 0))
    return aten.select_scatter.default, (dim, step.index)


def _split(step: ViewStep, base: torch.Tensor) -> tuple[Any, tuple]:
    size, dim = _bound(step, ("split_size", 1), ("dim", 0))
    start = step.index * size
    return aten.slice_scatter.default, (dim, start, min(start + size, base.size(dim)), 1)


def _split_with_sizes(step: ViewStep, base: torch.Tensor) -> tuple[Any, tuple]:
    sizes, dim = _bound(step, ("split_sizes", None), ("dim", 0))
    start = sum(sizes[: step.index])
    return aten.slice_scatter.default, (dim, start, start + sizes[step.index], 1)


def _transpose(step: ViewStep, base: torch.Tensor) -> tuple[Any, tuple]:
    return aten.transpose.int, tuple(_bound(step, ("dim0", 0), ("dim1", 1)))


def _permute(step: ViewStep, base: torch.Tensor) -> tuple[Any, tuple]:
    (dims,) = _bound(step, ("dims", None))
    rank = len(dims)
    inverse = [0] * rank
    for position, dim in enumerate(dims):
        inverse[dim % rank] = position
    return aten.permute.default, (inverse,)


def _reshape_back(step: ViewStep, base: torch.Tensor) -> None:
    return None


SCATTERS: dict[Any, Scatter] = {
    aten.slice.Tensor: _slice,
    aten.select.int: _select,
    aten.diagonal.default: _diagonal,
    aten.as_strided.default: _as_strided,
    aten.unbind.int: _unbind,
    aten.split.Tensor: _split,
    aten.split_with_sizes.default: _split_with_sizes,
    aten.transpose.int: _transpose,
    aten.permute.default: _permute,
    # The same elements in the same order, another shape: view the new value as the base.
    aten.view.default: _reshape_back,
    aten._unsafe_view.default: _reshape_back,
    aten._reshape_alias.default: _reshape_back,
    aten.unsqueeze.default: _reshape_back,
    aten.squeeze.default: _reshape_back,
    aten.squeeze.dim: _reshape_back,
    aten.squeeze.dims: _reshape_back,
    aten.alias.default: _reshape_back,
    aten.detach.default: _reshape_back,
    aten.t.default: lambda step, base: (aten.t.default, ()),
}

# Views that reorder the base's elements: a new value goes back through the same (or the
# inverse) view of itself, with no base argument.
UNARY_INVERSES = frozenset({aten.transpose.int, aten.permute.default, aten.t.default})
