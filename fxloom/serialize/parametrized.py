"""Modules with parametrized tensors (``weight_norm``, ``orthogonal``...), in a saved file.

``torch.nn.utils.parametrize`` swaps such a module's class for one made on the
fly (``ParametrizedConv1d``, a subclass of ``Conv1d`` with a property per
parametrized tensor) and keeps the parametrizations in a ``parametrizations``
child of ordinary modules. A file records the plain class and the names of
the parametrized tensors; loading rebuilds the plain module with its children
as usual, then has torch make the subclass and properties again.
"""

from __future__ import annotations

from torch import nn
from torch.nn.utils import parametrize

from fxloom.serialize.errors import SerializationError

__all__ = ["saved_class", "parametrized_names", "restore_parametrizations"]


def saved_class(module: nn.Module, cls: type) -> type:
    """The class a module is saved as: the class before parametrization, if it has any."""
    return (
        parametrize.type_before_parametrizations(module)
        if parametrize.is_parametrized(module)
        else cls
    )


def parametrized_names(module: nn.Module) -> list[str]:
    return list(module.parametrizations) if parametrize.is_parametrized(module) else []


def restore_parametrizations(module: nn.Module, names: object, where: str) -> None:
    """Give ``module`` its parametrized class and one property per name in ``names``."""
    lists = module._modules.get("parametrizations")
    if (
        not isinstance(names, list)
        or not isinstance(lists, nn.ModuleDict)
        or set(names) != set(lists)
    ):
        raise SerializationError(
            f"{where}: the parametrized tensors {names!r} must be the names of its parametrizations"
        )
    for name in names:
        if not isinstance(lists[name], parametrize.ParametrizationList) or hasattr(
            type(module), name
        ):
            raise SerializationError(f"{where}: {name!r} cannot be a parametrized tensor")
    parametrize._inject_new_class(module)
    for name in names:
        parametrize._inject_property(module, name)
