"""The checks a captured module runs on its inputs, for every frontend: one family, one module.

A graph captured from example inputs holds only for inputs like them, so the
generated code checks its inputs before computing anything and a call that
breaks an assumption fails with a message naming the input and the fix:

===================== ================================ ====================================
what is checked       symbolic tracing records         export records
===================== ================================ ====================================
a tensor input        ``check_tensor_input`` (dtype,   ``check_tensor`` (dtype, shape; a
                      rank)                            symbolic size given as its text)
a value fixed by the  ``check_fixed`` (a literal) or   ``check_value``
capture               a ``FixedArgument`` (an object)
the inputs' structure a ``FlattenedInput`` per         ``flatten_inputs`` (the generated
                      structured argument              code's first line)
``*args``/``**kwargs`` ``check_variadic_length``,       (flattened by their tree spec)
                      ``check_variadic_keys``
===================== ================================ ====================================

Values fixed by either frontend are compared one way (``_same``: ``is``, then a ``==``
that gives a bool). Each check has a row in ``fxloom.ops.runtime_functions`` saying its
effect (a check: kept by dead-code elimination, writes nothing), that lowering and
splitting keep it on the host, and its TorchScript twin; nothing here registers itself
anywhere. A check used inside a module being traced again records itself as a call
(``recorded_when_traced``) instead of running: a frontend's value that records calls says
so with a ``_fxloom_record_call`` method (the tracer's ``Proxy``), so no frontend is imported.

Depends on ``fxloom.pytree``, the registry and the twins (``fxloom._guards_torchscript``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from fxloom import _guards_torchscript as twins
from fxloom import pytree
from fxloom._guards_torchscript import fixed_message, tensor_input_message
from fxloom.ops.runtime_functions import RUNTIME_FUNCTIONS

__all__ = [
    "FixedArgument",
    "FixedArgumentError",
    "FlattenedInput",
    "check_fixed",
    "check_tensor",
    "check_tensor_input",
    "check_value",
    "check_variadic_keys",
    "check_variadic_length",
    "fixed_argument_guard",
    "flatten_inputs",
    "recorded_when_traced",
]


def recorded_when_traced(check: Callable[..., None]) -> Callable[..., Any]:
    """Make ``check`` a leaf of tracing, and scriptable where its row names a twin.

    The checked value is always the first argument; only it can be a frontend's value (the
    others are constants), so one lookup on its type keeps the common path cheap. ``torch.jit.script``
    compiles the twin in its place (``__prepare_scriptable__``); without one, a module
    calling the check does not script (the row says why).
    """

    @functools.wraps(check)
    def run(value: Any, *rest: Any) -> Any:
        record = getattr(type(value), "_fxloom_record_call", None)
        if record is not None:
            return record(value, run, (value, *rest))
        return check(value, *rest)

    twin_name = RUNTIME_FUNCTIONS[f"{check.__module__}.{check.__qualname__}"].twin
    if twin_name is not None:
        twin = vars(twins)[twin_name.rpartition(".")[2]]
        run.__prepare_scriptable__ = lambda: twin  # type: ignore[attr-defined]
    return run


def _same(value: Any, expected: Any) -> bool:
    """Whether an input is the value it was fixed to (``is``, then ``==``)."""
    if value is expected:
        return True
    try:
        return bool(value == expected)
    except Exception:  # == that does not give a bool (tensors, arrays): not the same
        return False


def _kind(value: Any) -> str:
    """A value's type and, for a container, its structure (``a dict TreeSpec(...)``)."""
    _, spec = pytree.tree_flatten(value)
    return f"a {type(value).__name__} {spec}" if not spec.is_leaf() else f"a {type(value).__name__}"


# ------------------------------------------------------------------ tensor inputs
@recorded_when_traced
def check_tensor_input(value: Any, dtype: torch.dtype, ndim: int, name: str) -> None:
    """Raise if an input's dtype or rank differs from the example the module was traced with."""
    if not isinstance(value, torch.Tensor) or value.dtype != dtype or value.dim() != ndim:
        got = (
            f"a {value.dim()}-d {value.dtype} tensor"
            if isinstance(value, torch.Tensor)
            else type(value).__name__
        )
        raise TypeError(tensor_input_message(name, f"{ndim}-d {dtype}", got))


def check_tensor(value: Any, shape: tuple[int | str, ...], dtype: torch.dtype, name: str) -> None:
    """Raise unless ``value`` is a tensor of ``dtype`` whose sizes are ``shape``'s ints.

    A string in ``shape`` is a symbolic size (its expression, e.g. ``"2*s0"``): any size
    passes here, ``fxloom.values.symbolic.size_checks.check_sizes`` checks it against the others.
    """
    if not isinstance(value, torch.Tensor):
        raise TypeError(
            f"input {name!r}: the program was exported with a tensor here, got "
            f"{type(value).__name__}"
        )
    if value.dtype != dtype:
        raise TypeError(
            f"input {name!r}: the program was exported with dtype {dtype}, got {value.dtype}"
        )
    sizes = value.shape
    if tuple(sizes) == shape:  # every size static and right: the common case, first
        return
    if len(sizes) == len(shape) and all(
        expected == got or isinstance(expected, str) for expected, got in zip(shape, sizes)
    ):
        return
    raise ValueError(_shape_mismatch(name, shape, sizes))


def _shape_mismatch(name: str, shape: tuple[int | str, ...], sizes: torch.Size) -> str:
    differing = [
        f"dimension {dim}: {got} instead of {expected}"
        for dim, (expected, got) in enumerate(zip(shape, sizes))
        if expected != got and not isinstance(expected, str)
    ]
    if len(sizes) != len(shape):
        where, fix = "", "export again with an example of this shape"
    else:
        where = f" ({differing[0]})"
        fix = (
            "export again with an example of this shape, or declare this dimension dynamic "
            "with dynamic_shapes"
        )
    shape_text = f"[{', '.join(str(size) for size in shape)}]"
    return (
        f"input {name!r}: the program was exported for shape {shape_text}, got "
        f"{list(sizes)}{where}; {fix}"
    )


# ------------------------------------------------------------------ fixed values
class FixedArgumentError(ValueError, AssertionError):
    """An argument fixed by ``concrete_args`` got another value: a ``ValueError``, and the
    ``AssertionError`` torch.fx's generated check raises, so handlers of either catch it."""


# Fixed values a check can print in the code and TorchScript can type: other fixed objects
# (config objects, tensors...) are held by a FixedArgument.
_PRINTABLE_FIXED_TYPES = frozenset({type(None), bool, int, float, str})


@recorded_when_traced
def check_fixed(value: Any, expected: Any, name: str) -> None:
    """Raise if an argument fixed by ``concrete_args`` to a literal gets another value.

    Generated code shows the value: ``check_fixed(flag, True, 'flag')``.
    """
    if not _same(value, expected):
        raise FixedArgumentError(fixed_message(name, repr(expected), repr(value)))


def check_value(value: Any, expected: Any, name: str) -> None:
    """Raise unless a non-tensor input is the value the program was exported with."""
    if not _same(value, expected):
        raise ValueError(
            f"input {name!r}: the program was exported with {expected!r}, which its graph "
            f"depends on; got {value!r}. Export again with this value"
        )


def fixed_argument_guard(name: str, expected: Any) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """The check for argument ``name`` fixed to ``expected``, and its arguments after the value.

    >>> fixed_argument_guard("flag", True)[1]
    (True, 'flag')
    """
    if type(expected) in _PRINTABLE_FIXED_TYPES:
        return check_fixed, (expected, name)
    return FixedArgument(name, expected), ()


class FixedArgument:
    """Checks that an argument fixed by ``concrete_args`` to an object still gets that object.

    A callable holding the expected value itself (any object but a literal, which
    ``check_fixed`` prints instead), so a fixed config object is checked too. Generated
    code calls it on the argument: ``config_fixed(config)``.
    """

    def __init__(self, name: str, expected: Any) -> None:
        self.name = name
        self.expected = expected
        self.__name__ = f"{name}_fixed"  # how generated code names it

    def __call__(self, value: Any) -> Any:
        record = getattr(type(value), "_fxloom_record_call", None)
        if record is not None:  # traced again: record the check, do not run it
            return record(value, self, (value,))
        if not _same(value, self.expected):
            raise FixedArgumentError(fixed_message(self.name, repr(self.expected), repr(value)))
        return None

    def __repr__(self) -> str:
        return f"FixedArgument({self.name}={self.expected!r})"


# ------------------------------------------------------------------ structure
class FlattenedInput:
    """The leaves of an argument given as a structure with ``PH`` inside (``concrete_args``).

    Traced with ``{"x": {"a": PH, "b": 3}}``, the generated code flattens ``x`` with
    ``fxloom.pytree`` and reads its ``PH`` leaves; this checks that ``x`` has the traced
    structure and the fixed leaves their traced values: ``x_leaves(x)`` returns the leaves.
    """

    def __init__(self, name: str, spec: pytree.TreeSpec, fixed: dict[int, Any]) -> None:
        self.name = name
        self.spec = spec
        self.fixed = fixed  # leaf index -> the value it was traced with
        self.__name__ = f"{name}_leaves"  # how generated code names it

    def __call__(self, value: Any) -> Any:
        record = getattr(type(value), "_fxloom_record_call", None)
        if record is not None:  # traced again: record the call, do not run it
            return record(value, self, (value,))
        leaves, spec = pytree.tree_flatten(value)
        if spec != self.spec:
            raise TypeError(
                f"argument {self.name!r} was traced as {self.spec} (concrete_args), but "
                f"{value!r} has the structure {spec}; pass it in the traced structure or retrace"
            )
        for index, expected in self.fixed.items():
            if not _same(leaves[index], expected):
                raise ValueError(
                    f"entry {index} of argument {self.name!r} (flattened) was fixed to "
                    f"{expected!r} when this module was traced (concrete_args), but "
                    f"{leaves[index]!r} was passed; retrace to use another value"
                )
        return leaves

    def __repr__(self) -> str:
        return f"FlattenedInput({self.name}: {self.spec})"


def flatten_inputs(values: tuple, spec: pytree.TreeSpec, names: tuple[str, ...]) -> list[Any]:
    """The leaves of the forward's arguments ``values``, which must have the structure ``spec``;
    else a ``ValueError`` naming the argument, what it is and what was exported."""
    try:
        return pytree.tree_flatten_spec(values, spec)
    except ValueError:
        pass
    for name, value, expected in zip(names, values, spec.children):
        try:
            pytree.tree_flatten_spec(value, expected)
        except ValueError as err:
            raise ValueError(
                f"input {name!r}: the program was exported with the structure {expected}, "
                f"but {_kind(value)} was passed ({err}); pass it as exported, or export again"
            ) from None
    raise ValueError(f"the inputs do not have the exported structure {spec}")


# ------------------------------------------------------------------ *args / **kwargs
@recorded_when_traced
def check_variadic_length(args: tuple[Any, ...], expected: int, name: str) -> None:
    """Raise if ``*name`` gets another number of arguments than it was traced with."""
    if len(args) != expected:
        raise TypeError(
            f"this module was traced with {expected} extra positional argument(s) in *{name}, "
            f"but {len(args)} were passed; retrace with concrete_args={{{name!r}: (PH, ...)}} "
            "listing one entry per argument"
        )


@recorded_when_traced
def check_variadic_keys(
    kwargs: dict[str, Any], expected: tuple[str, ...], name: str, fixed: tuple[str, ...] = ()
) -> None:
    """Raise if ``**name`` lacks a key it was traced with, or gets one it was not.

    ``fixed`` keys were traced with a value of their own: they may be left out.
    """
    missing = set(expected) - set(kwargs)
    unexpected = set(kwargs) - set(expected) - set(fixed)
    if missing or unexpected:
        traced = sorted(expected) + [f"{key} (fixed)" for key in fixed]
        raise TypeError(
            f"this module was traced with keyword arguments {traced} in **{name}, but "
            f"got {sorted(kwargs)}; retrace with concrete_args={{{name!r}: {{key: PH, ...}}}}"
        )
