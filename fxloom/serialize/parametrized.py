"""Modules with parametrized tensors (``weight_norm``, ``orthogonal``...), in a saved file.

``torch.nn.utils.parametrize`` swaps such a module's class for one made on the
fly (``ParametrizedConv1d``, a subclass of ``Conv1d`` with a property per
parametrized tensor) and keeps the parametrizations in a ``parametrizations``
child (a ``ModuleDict`` of ``ParametrizationList``s). Reading such a property
*runs* the parametrizations, so a file could make any module it holds run while
it is being checked. Hence:

* Only torch's own parametrizations are restored (``PARAMETRIZATIONS``), holding no
  modules of their own; anything else in a ``ParametrizationList`` (a GraphModule, any
  module with a ``forward`` from the file) is refused, at saving as at loading.
* The shape of a parametrized tensor is computed from its originals' shapes by the
  table's rule, never by running it: ``parametrized_shapes``.
* A file records the plain class and the names of the parametrized tensors; loading
  rebuilds the plain module with its children as usual, checks them, then has torch
  make the subclass and properties again (which reads nothing through them).

Everything here reads modules' dictionaries (``vars``, ``_parameters``, ``_buffers``,
``_modules``), never attributes through ``getattr``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from torch import nn
from torch.nn.utils import parametrizations, parametrize

from fxloom._namespace import is_plain_identifier
from fxloom.serialize.errors import SerializationError

__all__ = [
    "PARAMETRIZATIONS",
    "ENUM_ATTRIBUTES",
    "saved_class",
    "parametrized_names",
    "parametrized_shapes",
    "check_parametrization_list",
    "restore_parametrizations",
]

Shape = tuple[int, ...]


def _dim(p: nn.Module, rank: int) -> int:
    dim = vars(p).get("dim")
    if type(dim) is not int or not -rank <= dim < max(rank, 1):
        raise SerializationError(f"its dim must be a dimension of a {rank}-d tensor, found {dim!r}")
    return dim % max(rank, 1)


def _weight_norm(p: nn.Module, shapes: list[Shape]) -> Shape:
    # forward(g, v) = g * v / ||v|| over every dim but ``dim`` (-1: over all of v).
    if len(shapes) != 2:
        raise SerializationError(f"weight norm takes two tensors (g, v), found {len(shapes)}")
    g, v = shapes
    if vars(p).get("dim") == -1:
        expected: Shape = ()
    else:
        dim = _dim(p, len(v))
        expected = tuple(size if d == dim else 1 for d, size in enumerate(v))
    if g != expected:
        raise SerializationError(
            f"its g has shape {list(g)}, but v {list(v)} makes it {list(expected)}"
        )
    return v


def _orthogonal(p: nn.Module, shapes: list[Shape]) -> Shape:
    (shape,) = _one(shapes)
    declared = vars(p).get("shape")
    if len(shape) < 2 or not isinstance(declared, (tuple, list)) or tuple(declared) != shape:
        raise SerializationError(f"its shape attribute must be the matrix's shape {list(shape)}")
    base = p._buffers.get("base")
    side = max(shape[-2:])
    if base is not None and tuple(base.shape) != (*shape[:-2], side, side):
        raise SerializationError(
            f"its base has shape {list(base.shape)}, not {[*shape[:-2], side, side]}"
        )
    return shape


def _spectral_norm(p: nn.Module, shapes: list[Shape]) -> Shape:
    (shape,) = _one(shapes)
    state = vars(p)
    if type(state.get("n_power_iterations")) is not int or state["n_power_iterations"] < 1:
        raise SerializationError("its n_power_iterations must be a positive count")
    if type(state.get("eps")) is not float or not state["eps"] > 0:
        raise SerializationError("its eps must be a positive float")
    if len(shape) > 1:  # u and v: singular vectors of the weight with ``dim`` first, flattened
        dim = _dim(p, len(shape))
        rows = shape[dim]
        columns = 1
        for d, size in enumerate(shape):
            columns *= size if d != dim else 1
        for name, size in (("_u", rows), ("_v", columns)):
            vector = p._buffers.get(name)
            if vector is None or tuple(vector.shape) != (size,):
                raise SerializationError(f"its {name} must have shape [{size}]")
    return shape


def _one(shapes: list[Shape]) -> list[Shape]:
    if len(shapes) != 1:
        raise SerializationError(f"it takes one tensor, found {len(shapes)}")
    return shapes


# torch's own parametrizations (torch.nn.utils.parametrizations), the only ones a file may
# hold, each with the shape it makes of its inputs' shapes (read from its state, not run).
PARAMETRIZATIONS: dict[type, Callable[[nn.Module, list[Shape]], Shape]] = {
    parametrizations._WeightNorm: _weight_norm,
    parametrizations._Orthogonal: _orthogonal,
    parametrizations._SpectralNorm: _spectral_norm,
}
# Attributes of these whose values are enum members, saved by member name.
ENUM_ATTRIBUTES: dict[tuple[type, str], type] = {
    (parametrizations._Orthogonal, "orthogonal_map"): parametrizations._OrthMaps,
}
# ParametrizationList's own attributes, with their types.
_LIST_ATTRIBUTES = {"unsafe": bool, "is_tensor": bool, "ntensors": int}


def saved_class(module: nn.Module, cls: type) -> type:
    """The class a module is saved as: the class before parametrization, if it has any."""
    return (
        parametrize.type_before_parametrizations(module)
        if parametrize.is_parametrized(module)
        else cls
    )


def parametrized_names(module: nn.Module) -> list[str]:
    """The names of ``module``'s parametrized tensors: the entries of its ``parametrizations``
    child that its class makes properties of (read without ``getattr``)."""
    lists = module._modules.get("parametrizations")
    if type(lists) is not nn.ModuleDict:
        return []
    cls = type(module)
    return [n for n in lists._modules if isinstance(inspect.getattr_static(cls, n, None), property)]


def check_parametrization_list(plist: nn.Module, where: str) -> Shape:
    """The shape ``plist`` (a ``ParametrizationList``) makes; ``SerializationError`` where it
    holds anything but torch's parametrizations or its originals do not fit them."""
    state = vars(plist)
    for name, kind in _LIST_ATTRIBUTES.items():
        if type(state.get(name)) is not kind:
            raise SerializationError(f"{where}: its {name} must be a {kind.__name__}")
    shapes = _original_shapes(plist, where)
    if list(plist._modules) != [str(i) for i in range(len(plist._modules))] or not plist._modules:
        raise SerializationError(f"{where}: its parametrizations must be numbered 0, 1, ...")
    for index, p in plist._modules.items():
        rule = PARAMETRIZATIONS.get(type(p))
        if rule is None:
            raise SerializationError(
                f"{where}.{index}: a {type(p).__qualname__} cannot be a parametrization; only "
                f"torch's own ({', '.join(c.__name__ for c in PARAMETRIZATIONS)}) are, since "
                "reading the parametrized tensor runs it"
            )
        if p._modules:
            raise SerializationError(f"{where}.{index}: a parametrization holds no modules")
        try:
            shapes = [rule(p, shapes)]
        except SerializationError as e:
            raise SerializationError(f"{where}.{index} ({type(p).__name__}): {e}") from None
    return shapes[0]


def _original_shapes(plist: nn.Module, where: str) -> list[Shape]:
    """The shapes of the tensors the first parametrization takes: ``original`` or
    ``original0``, ``original1``..., parameters or buffers."""
    count = vars(plist)["ntensors"]
    names = ["original"] if vars(plist)["is_tensor"] else [f"original{i}" for i in range(count)]
    held = {**plist._parameters, **plist._buffers}
    if set(held) != set(names) or count != len(names) or any(held[n] is None for n in names):
        raise SerializationError(f"{where}: its tensors must be {names}, found {sorted(held)}")
    return [tuple(held[name].shape) for name in names]


def parametrized_shapes(module: nn.Module, where: str = "") -> dict[str, Shape]:
    """The shape of each parametrized tensor of ``module``, computed, not read through it."""
    lists = module._modules.get("parametrizations")
    return {
        name: check_parametrization_list(lists._modules[name], f"{where}.parametrizations.{name}")
        for name in parametrized_names(module)
    }


def restore_parametrizations(module: nn.Module, names: object, where: str) -> None:
    """Give ``module`` its parametrized class and one property per name in ``names``."""
    lists = module._modules.get("parametrizations")
    if (
        not isinstance(names, list)
        or type(lists) is not nn.ModuleDict
        or names != list(lists._modules)
    ):
        raise SerializationError(
            f"{where}: the parametrized tensors {names!r} must be the names of its parametrizations"
        )
    for name in names:
        plist = lists._modules[name]
        if type(plist) is not parametrize.ParametrizationList:
            raise SerializationError(f"{where}.parametrizations.{name}: not a ParametrizationList")
        _check_free(module, name, where)
        check_parametrization_list(plist, f"{where}.parametrizations.{name}")
    parametrize._inject_new_class(module)
    for name in names:
        parametrize._inject_property(module, name)


def _check_free(module: nn.Module, name: str, where: str) -> None:
    """A parametrized tensor's name means nothing else in the module or its class."""
    held = (module._parameters, module._buffers, module._modules, vars(module))
    if (
        not isinstance(name, str)
        or not is_plain_identifier(name)
        or any(name in table for table in held)
        or inspect.getattr_static(type(module), name, None) is not None
    ):
        raise SerializationError(
            f"{where}: {name!r} cannot be a parametrized tensor (the module holds or defines "
            "something of that name)"
        )
