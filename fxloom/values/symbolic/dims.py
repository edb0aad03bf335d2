"""``Dim``: how a user says which dimensions of the inputs may vary, as torch.export users write it.

A named ``Dim`` is a size that may take any value in ``[min, max]``; one
``Dim`` used for two dimensions says they are always equal. Integer
arithmetic on a ``Dim`` gives a ``DerivedDim``, a size that is a fixed linear
function of it (``2 * seq``, ``seq - 1``, ``2 * seq + 1``). The hints
``Dim.AUTO``, ``Dim.STATIC`` and ``Dim.DYNAMIC`` leave the decision to export,
fix the size, or require it to stay dynamic::

    >>> from fxloom.export import Dim, dims
    >>> seq = Dim("seq", min=1, max=512)
    >>> seq
    Dim('seq', min=1, max=512)
    >>> doubled = 2 * seq + 1
    >>> doubled, doubled.root is seq, (doubled.min, doubled.max)
    (2*seq + 1, True, (3, 1025))
    >>> batch, heads = dims("batch", "heads", max=64)
    >>> Dim.AUTO, Dim.DYNAMIC(min=4)
    (Dim.AUTO, Dim.DYNAMIC(min=4))

``fxloom.values.symbolic.dynamic_shapes`` matches these to the inputs and checks them
against the examples. Depends on nothing of fxloom.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Dim", "DerivedDim", "DimHint", "dims"]

_HINT_KINDS = ("AUTO", "STATIC", "DYNAMIC")
_ONLY_LINEAR = "only Dim * positive int, Dim + int and Dim - int make derived dimensions"


def _check_range(what: str, low: int, high: int | None) -> None:
    for bound in (low, high):
        if bound is not None and (type(bound) is not int or bound < 0):
            raise ValueError(f"{what}: bounds are non-negative ints, got {bound!r}")
    if high is not None and high < low:
        raise ValueError(f"{what}: the range [{low}, {high}] is empty")


def _integer(value: object, expression: str) -> int:
    if type(value) is not int:  # bool, float, another Dim: not a linear function of one Dim
        raise TypeError(f"{expression}: {_ONLY_LINEAR}, got a {type(value).__name__}")
    return value


def _no_division(name: str, operator: str, other: object) -> str:
    return (
        f"{name} {operator} {other!r}: {_ONLY_LINEAR}; to say a size is a fraction of another, "
        "name the smaller one and derive the larger (half = Dim('half'); full = 2 * half)"
    )


def _linear_text(name: str, coefficient: int, offset: int) -> str:
    """``2*seq + 1``, ``seq - 1``, ``seq``: the way sympy (and torch.export) prints it."""
    text = name if coefficient == 1 else f"{coefficient}*{name}"
    if offset:
        text += f" + {offset}" if offset > 0 else f" - {-offset}"
    return text


@dataclass(frozen=True, slots=True)
class DimHint:
    """``Dim.AUTO``, ``Dim.STATIC`` or ``Dim.DYNAMIC``, optionally bounded: ``Dim.AUTO(max=64)``.

    * ``AUTO``: export decides: dynamic unless the program needs one value (an
      example size of 0 or 1 makes it static, those sizes being special to operators);
    * ``STATIC``: fixed to the example's size;
    * ``DYNAMIC``: must stay dynamic: an error if the program needs one value.
    """

    kind: str
    min: int | None = None
    max: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in _HINT_KINDS:
            raise ValueError(f"a dimension hint is one of {_HINT_KINDS}, got {self.kind!r}")
        _check_range(f"Dim.{self.kind}", self.min or 0, self.max)

    def __call__(self, *, min: int | None = None, max: int | None = None) -> DimHint:
        """This hint with a range: ``Dim.DYNAMIC(min=2, max=64)``."""
        return DimHint(self.kind, min, max)

    def __repr__(self) -> str:
        bounds = [
            f"{key}={value}"
            for key, value in (("min", self.min), ("max", self.max))
            if value is not None
        ]
        return f"Dim.{self.kind}" + (f"({', '.join(bounds)})" if bounds else "")


class Dim:
    """A dimension size that may take any value in ``[min, max]`` (inclusive; ``max=None``: no bound).

    Equal and hashed by identity: the same ``Dim`` object in two places ties those sizes.
    """

    AUTO = DimHint("AUTO")
    STATIC = DimHint("STATIC")
    DYNAMIC = DimHint("DYNAMIC")

    def __init__(self, name: str, *, min: int | None = None, max: int | None = None) -> None:
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"Dim name {name!r} must be a Python identifier")
        low = 0 if min is None else min
        _check_range(f"Dim {name!r}", low, max)
        self.__name__ = name
        self.min = low
        self.max = max

    def __repr__(self) -> str:
        bounds = "" if self.min == 0 else f", min={self.min}"
        bounds += "" if self.max is None else f", max={self.max}"
        return f"Dim({self.__name__!r}{bounds})"

    # ---- arithmetic: increasing linear functions of one root Dim

    def __add__(self, other: int) -> DerivedDim:
        return self._derive(1, _integer(other, f"{self.__name__} + {other!r}"))

    def __radd__(self, other: int) -> DerivedDim:
        return self + other

    def __sub__(self, other: int) -> DerivedDim:
        return self._derive(1, -_integer(other, f"{self.__name__} - {other!r}"))

    def __rsub__(self, other: object) -> DerivedDim:
        raise TypeError(
            f"{other!r} - {self.__name__} decreases as {self.__name__} grows; {_ONLY_LINEAR}"
        )

    def __mul__(self, other: int) -> DerivedDim:
        factor = _integer(other, f"{self.__name__} * {other!r}")
        if factor < 1:
            raise TypeError(f"{self.__name__} * {other!r}: the factor must be >= 1; {_ONLY_LINEAR}")
        return self._derive(factor, 0)

    def __rmul__(self, other: int) -> DerivedDim:
        return self * other

    def __truediv__(self, other: object) -> DerivedDim:
        raise TypeError(_no_division(self.__name__, "/", other))

    def __floordiv__(self, other: object) -> DerivedDim:
        raise TypeError(_no_division(self.__name__, "//", other))

    def _derive(self, coefficient: int, offset: int) -> DerivedDim:
        """``coefficient * self + offset``."""
        return DerivedDim(self, coefficient, offset)


class DerivedDim(Dim):
    """``coefficient * root + offset``: a size that follows the ``Dim`` ``root`` (``2*seq + 1``).

    Its range is the root's range mapped through the function; arithmetic on it
    composes into a new function of the same root (``2 * (seq + 1)`` is ``2*seq + 2``).
    """

    def __init__(self, root: Dim, coefficient: int, offset: int) -> None:
        self.root = root
        self.coefficient = coefficient
        self.offset = offset
        self.__name__ = _linear_text(root.__name__, coefficient, offset)

    @property
    def min(self) -> int:
        low = self.of(self.root.min)
        if low < 0:
            raise ValueError(
                f"{self.__name__} is negative for {self.root.__name__} = {self.root.min}; "
                f"declare Dim({self.root.__name__!r}, min={-(self.offset // self.coefficient)}) "
                "or more"
            )
        return low

    @property
    def max(self) -> int | None:
        return None if self.root.max is None else self.of(self.root.max)

    def of(self, root_value: int) -> int:
        """This size when the root is ``root_value``."""
        return self.coefficient * root_value + self.offset

    def root_value(self, size: int) -> int | None:
        """The root's value that gives ``size``, None if no integer does."""
        quotient, remainder = divmod(size - self.offset, self.coefficient)
        return None if remainder else quotient

    def _derive(self, coefficient: int, offset: int) -> DerivedDim:
        # coefficient * (a * root + b) + offset, still linear in the root.
        return DerivedDim(
            self.root, coefficient * self.coefficient, coefficient * self.offset + offset
        )

    def __repr__(self) -> str:
        return self.__name__


def dims(*names: str, min: int | None = None, max: int | None = None) -> tuple[Dim, ...]:
    """One ``Dim`` per name, all with the range ``[min, max]``: ``batch, seq = dims("batch", "seq")``."""
    return tuple(Dim(name, min=min, max=max) for name in names)
