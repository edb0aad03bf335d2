"""Read-only list and dict used for node arguments.

A node's ``args`` and ``kwargs`` are values: changing them in place would bypass
the bookkeeping of ``Node.users``. Lists and dicts found in arguments are
therefore frozen into these types when a node is created or its arguments are
assigned. To change an argument, assign a new value (``node.args = ...``) or use
``Node.update_arg``/``Node.update_kwarg``.

Both are registered with torch's pytree (``torch.utils._pytree``), as torch.fx's
are, so code that flattens node arguments with it sees their elements::

    >>> import torch.utils._pytree as pytree
    >>> pytree.tree_leaves(immutable_dict(a=immutable_list([1, 2]), b=3))
    [1, 2, 3]
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NoReturn

import torch.utils._pytree as torch_pytree

__all__ = ["immutable_list", "immutable_dict"]


def _refuse(self: Any, *args: Any, **kwargs: Any) -> NoReturn:
    raise TypeError(
        f"'{type(self).__name__}' is read-only: node arguments are values. "
        "Assign a new value instead (node.args = ..., node.update_arg(i, v), "
        "node.update_kwarg(k, v))."
    )


class immutable_list(list):  # noqa: N801 - mirrors the documented name
    """A list that refuses in-place changes; hashable like a tuple."""

    __slots__ = ()

    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse
    append = extend = insert = pop = remove = clear = sort = reverse = _refuse

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(self))

    def __reduce__(self) -> tuple:
        return (immutable_list, (list(self),))

    def __copy__(self) -> immutable_list:
        return self

    def __deepcopy__(self, memo: dict) -> immutable_list:
        from copy import deepcopy

        return immutable_list(deepcopy(list(self), memo))


class immutable_dict(dict):  # noqa: N801 - mirrors the documented name
    """A dict that refuses in-place changes; hashable by its items."""

    __slots__ = ()

    __setitem__ = __delitem__ = __ior__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(self.items()))

    def __reduce__(self) -> tuple:
        return (immutable_dict, (dict(self),))

    def __copy__(self) -> immutable_dict:
        return self

    def __deepcopy__(self, memo: dict) -> immutable_dict:
        from copy import deepcopy

        return immutable_dict(deepcopy(dict(self), memo))


# ------------------------------------------------------- torch's pytree
def _flatten_list(values: immutable_list) -> tuple[list[Any], None]:
    return list(values), None


def _flatten_list_with_keys(values: immutable_list) -> tuple[list[tuple[Any, Any]], None]:
    return [(torch_pytree.SequenceKey(i), v) for i, v in enumerate(values)], None


def _unflatten_list(values: Iterable[Any], context: None) -> immutable_list:
    return immutable_list(values)


def _flatten_dict(mapping: immutable_dict) -> tuple[list[Any], list[Any]]:
    return list(mapping.values()), list(mapping.keys())


def _flatten_dict_with_keys(mapping: immutable_dict) -> tuple[list[tuple[Any, Any]], list[Any]]:
    return [(torch_pytree.MappingKey(k), v) for k, v in mapping.items()], list(mapping.keys())


def _unflatten_dict(values: Iterable[Any], keys: list[Any]) -> immutable_dict:
    return immutable_dict(zip(keys, values))


torch_pytree.register_pytree_node(
    immutable_list,
    _flatten_list,
    _unflatten_list,
    serialized_type_name="fxloom.immutable_collections.immutable_list",
    flatten_with_keys_fn=_flatten_list_with_keys,
)
torch_pytree.register_pytree_node(
    immutable_dict,
    _flatten_dict,
    _unflatten_dict,
    serialized_type_name="fxloom.immutable_collections.immutable_dict",
    flatten_with_keys_fn=_flatten_dict_with_keys,
)
