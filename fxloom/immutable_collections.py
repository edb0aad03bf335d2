"""Read-only list and dict used for node arguments.

A node's ``args`` and ``kwargs`` are values: changing them in place would bypass
the bookkeeping of ``Node.users``. Lists and dicts found in arguments are
therefore frozen into these types when a node is created or its arguments are
assigned. To change an argument, assign a new value (``node.args = ...``) or use
``Node.update_arg``/``Node.update_kwarg``.
"""

from __future__ import annotations

from typing import Any, NoReturn

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
