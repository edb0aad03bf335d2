"""One identity per operator: every way of spelling an operation maps to one key.

A graph names the same operation in many ways: a module class (``nn.ReLU``), a torch function
(``torch.relu``), a ``torch.nn.functional`` one (``F.relu``), a Tensor method name
(``"relu"``, a ``call_method`` target) or descriptor (``torch.Tensor.relu``), an ATen packet or
overload (``aten.relu``, ``aten.relu.default``, the targets of exported graphs), a Python
operator (``operator.add``) and each one's in-place twin (``relu_``, ``aten.add_.Tensor``,
``operator.iadd``). ``op_key`` maps each to one ``OpKey``: the operation's canonical name, the
ATen name (``"relu"``, ``"add"``, ``"cat"``), and whether that spelling is the in-place twin.
The tables of operator facts (FLOP formulas, views, effects, quantized kernels, ONNX handlers,
functionalization's twins) are keyed by that name, so every frontend hits the same row::

    >>> import operator, torch
    >>> from torch import nn
    >>> import torch.nn.functional as F
    >>> {op_key(s).name for s in (nn.ReLU, torch.relu, F.relu, "relu", torch.ops.aten.relu.default)}
    {'relu'}
    >>> op_key(operator.iadd), op_key(torch.concat)
    (OpKey(name='add', in_place=True), OpKey(name='cat', in_place=False))
    >>> op_key(print) is None  # not a torch operation
    True

The spellings are derived from torch's own namespaces (an object counts only if it *is* the
attribute of that name in ``torch``, ``torch.nn.functional``, ``torch.Tensor``,
``torch.special``, ``torch.linalg`` or ``torch.fft``; ATen operators by their schema name),
then normalised by three small tables: ``ALIASES`` (other names of one operation:
``concat`` -> ``cat``), ``RENAMED`` (objects whose name means another operation there:
``F.unfold`` is ATen's ``im2col``, not the ``unfold`` view) and ``MODULE_KEYS`` (module
classes whose name does not spell their function's). In-place twins follow
``fxloom.ops.mutation``'s naming rule (``add_``). Lookups are cached per spelling: tracing
and cost analysis ask on every node.

Tables of operator facts are ``OpTable`` (a dict) and ``OpSet`` (a set): a row given for any
spelling is filed under its key, and every spelling finds it. Module classes keep rows of their
own (a module call's row reads the module: ``nn.Linear`` is quantized, ``F.linear`` is not),
unless the table says ``modules=True``; in-place twins find their operator's row only where
the table says ``in_place=True`` (a FLOP formula does; a "returns a fresh tensor" fact does
not).

A key says *which* operation, not how its arguments are laid out: ``F.batch_norm`` and
``aten.batch_norm`` order theirs differently. Rows read arguments by name where they can
(``fxloom.ops.flops.OpShapes.named``); a row for one spelling alone is ``OpTable.pin``-ned
(``fxloom.lower.onnx_ops_aten``), found before the key's row.

Depends on: torch and ``fxloom.ops.python_operators``.
"""

from __future__ import annotations

import re
from types import FunctionType, MethodType, ModuleType
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from fxloom.ops.python_operators import PYTHON_OPERATORS

__all__ = [
    "ALIASES",
    "MODULE_KEYS",
    "RENAMED",
    "OpKey",
    "OpSet",
    "OpTable",
    "functional_overload",
    "is_inplace_name",
    "node_op_key",
    "op_key",
    "op_name",
]


class OpKey(NamedTuple):
    """The operation a spelling calls (``name``), and whether it is the in-place twin."""

    name: str
    in_place: bool = False


# Other names of one operation -> its canonical (ATen) name. Python operators are named by
# their magic method's stem (``__truediv__`` -> ``truediv``).
ALIASES: dict[str, str] = {
    "multiply": "mul", "subtract": "sub", "divide": "div", "true_divide": "div",
    "truediv": "div", "floordiv": "floor_divide", "mod": "remainder", "pos": "positive",
    "negative": "neg", "absolute": "abs", "invert": "bitwise_not", "and": "bitwise_and",
    "or": "bitwise_or", "xor": "bitwise_xor", "lshift": "bitwise_left_shift",
    "rshift": "bitwise_right_shift", "clip": "clamp", "concat": "cat", "concatenate": "cat",
    "swapaxes": "transpose", "swapdims": "transpose", "moveaxis": "movedim", "greater": "gt",
    "greater_equal": "ge", "less": "lt", "less_equal": "le", "not_equal": "ne", "fix": "trunc",
    "arccos": "acos", "arcsin": "asin", "arctan": "atan", "arctan2": "atan2", "arccosh": "acosh",
    "arcsinh": "asinh", "arctanh": "atanh", "ger": "outer", "special_expit": "sigmoid",
    # torch functions that are one object under several names (they compare equal)
    "spmm": "mm", "dsmm": "mm", "hsmm": "hspmm", "saddmm": "sspaddmm",
}  # fmt: skip

# Objects whose name, in their namespace, means another operation than the same name elsewhere.
RENAMED: dict[Any, str] = {
    F.unfold: "im2col",  # sliding blocks of an image; Tensor.unfold is a view of windows
    F.fold: "col2im",
    nn.Unfold: "im2col",
    nn.Fold: "col2im",
}

# torch.nn classes whose name does not spell their function's (the others are derived:
# ``ReLU`` -> ``relu``, ``LayerNorm`` -> ``layer_norm``, ``MaxPool2d`` -> ``max_pool2d``).
MODULE_KEYS: dict[type, str] = {
    nn.BatchNorm1d: "batch_norm", nn.BatchNorm2d: "batch_norm", nn.BatchNorm3d: "batch_norm",
    nn.SyncBatchNorm: "batch_norm", nn.InstanceNorm1d: "instance_norm",
    nn.InstanceNorm2d: "instance_norm", nn.InstanceNorm3d: "instance_norm",
    nn.LeakyReLU: "leaky_relu", nn.RMSNorm: "rms_norm", nn.LPPool1d: "lp_pool1d",
    nn.LPPool2d: "lp_pool2d", nn.MultiheadAttention: "multi_head_attention_forward",
}  # fmt: skip

# Namespaces whose functions are operations, with the prefix ATen gives their names.
_NAMESPACES: tuple[tuple[Any, str], ...] = (
    (torch.Tensor, ""),
    (torch, ""),
    (F, ""),
    (torch.special, "special_"),
    (torch.linalg, "linalg_"),
    (torch.fft, "fft_"),
)

_MISSING = object()
_KEYS: dict[Any, OpKey | None] = {}
_namespace_names: dict[Any, str] | None = None
_all_names: frozenset[str] | None = None


def op_key(target: Any) -> OpKey | None:
    """The ``OpKey`` of a call target (any spelling; see the module), or ``None`` if none.

    ``target`` is a ``call_function`` target, a ``call_method`` name or a module class.

    >>> op_key("add_")
    OpKey(name='add', in_place=True)
    """
    try:
        return _KEYS[target]
    except KeyError:
        found = _derive(target)
    except TypeError:  # an unhashable callable: no torch spelling
        return None
    if found is not None or _long_lived(target):
        _KEYS[target] = found
    return found


def _long_lived(target: Any) -> bool:
    """Whether caching an answer for ``target`` may keep it alive: not a function or method
    written in Python (a user's closure may hold a model); names, builtins and classes."""
    return not isinstance(target, (FunctionType, MethodType))


def op_name(target: Any) -> str | None:
    """The canonical name of an out-of-place spelling; ``None`` for in-place ones and others.

    What tables that answer only for the functional form look up (quantized kernels, fresh
    results): ``op_name(torch.relu) == "relu"``, ``op_name(torch.relu_) is None``.
    """
    key = op_key(target)
    return None if key is None or key.in_place else key.name


def node_op_key(op: str, target: Any, module: nn.Module | None = None) -> OpKey | None:
    """The ``OpKey`` of a call node (opcode ``op``; ``module``: the called one, for call_module)."""
    if op == "call_module":
        return None if module is None else op_key(type(module))
    if op in ("call_function", "call_method"):
        return op_key(target)
    return None


def is_inplace_name(name: str) -> bool:
    """Whether a method or function of this name updates its first argument in place.

    >>> [is_inplace_name(n) for n in ("add_", "add", "__add__", "_helper_")]
    [True, False, False, False]
    """
    return name.endswith("_") and not name.endswith("__") and not name.startswith("_")


def functional_overload(overload: Any) -> Any:
    """The out-of-place overload of an in-place ATen overload, else ``None``.

    ``aten.add_.Tensor`` -> ``aten.add.Tensor``: the same overload of the name without ``_``
    (of the operation's key where that name has none: ``clip_`` -> ``clamp``).
    """
    key = op_key(overload)
    if key is None or not key.in_place or not isinstance(overload, torch._ops.OpOverload):
        return None
    for name in (overload._opname[:-1], key.name):
        packet = getattr(torch.ops.aten, name, None)
        if packet is not None and overload._overloadname in packet.overloads():
            return getattr(packet, overload._overloadname)
    return None


# --------------------------------------------------------------------- tables
class _OpRows:
    """What ``OpTable`` and ``OpSet`` share: a spelling's row is its operator key's row.

    Lookups are cached per spelling (they sit on hot paths: cost analysis, lowering); every
    method that changes the rows clears the cache.
    """

    def _setup(self, in_place: bool, modules: bool, aten: bool) -> None:
        self.in_place = in_place  # in-place twins (``add_``) find their operator's row
        self.modules = modules  # module classes without a row of their own find their key's
        self.aten = aten  # ATen overloads find their operator's row (else only pinned ones)
        self._found: dict[Any, Any] = {}  # spelling -> the row it finds, or _MISSING

    def row(self, spelling: Any) -> Any:
        """Where a row given for ``spelling`` is filed: its key's name (an ATen-only name such
        as ``"_to_copy"`` is one already); a class, a spelling with no key (a user's function)
        or an in-place twin the table keeps apart is filed as itself."""
        if isinstance(spelling, type):
            return spelling
        key = op_key(spelling)
        if key is None and isinstance(spelling, str):
            key = _normalised(spelling)
        if key is None or (key.in_place and not self.in_place):
            return spelling
        return key.name

    def candidates(self, spelling: Any) -> tuple[Any, ...]:
        """The rows a lookup of ``spelling`` tries, in order: itself, its ATen packet, its key."""
        found: tuple[Any, ...] = (spelling,)
        packet = getattr(spelling, "overloadpacket", None)
        if packet is not None:
            found += (packet,)
        if isinstance(spelling, type) and not self.modules:
            return found
        if packet is not None and not self.aten:
            return found
        key = op_key(spelling)
        if key is not None and (self.in_place or not key.in_place):
            found += (key.name,)
        return found

    def find(self, spelling: Any) -> Any:
        """The row ``spelling`` finds (``_MISSING`` if none), cached."""
        try:
            return self._found[spelling]
        except KeyError:
            pass
        except TypeError:  # an unhashable callable: in no table
            return _MISSING
        found = next((c for c in self.candidates(spelling) if self._has_row(c)), _MISSING)
        if _long_lived(spelling) or op_key(spelling) is not None:
            self._found[spelling] = found  # (a user's function is not kept alive: op_key)
        return found

    def _has_row(self, row: Any) -> bool:
        raise NotImplementedError


class OpTable(_OpRows, dict):
    """A dict of operator facts whose rows are operator keys: ``table[torch.relu] = row`` files
    the row under ``"relu"``, and ``table.get(aten.relu.default)`` finds it.

    A row filed under one spelling alone (``pin``) is found before the key's: for a spelling
    whose arguments are laid out unlike the others (``aten.embedding``). ``in_place``: whether
    in-place twins find their operator's row; ``modules``: whether module classes do;
    ``aten``: whether ATen overloads do (else only the ones pinned).
    """

    def __init__(
        self, rows: Any = (), *, in_place: bool = False, modules: bool = False, aten: bool = True
    ) -> None:
        self._setup(in_place, modules, aten)
        dict.__init__(self)
        self.update(rows)

    def _has_row(self, row: Any) -> bool:
        return dict.__contains__(self, row)

    def __setitem__(self, spelling: Any, value: Any) -> None:
        self._found.clear()
        dict.__setitem__(self, self.row(spelling), value)

    def pin(self, spelling: Any, value: Any) -> None:
        """File ``value`` under this very spelling (an ATen packet, a function), not its key."""
        self._found.clear()
        dict.__setitem__(self, spelling, value)

    def update(self, rows: Any = (), **named: Any) -> None:
        items = rows.items() if hasattr(rows, "items") else rows
        for spelling, value in (*items, *named.items()):
            self[spelling] = value

    def get(self, spelling: Any, default: Any = None) -> Any:
        try:  # ``find``, inlined: this is the hot path
            found = self._found[spelling]
        except (KeyError, TypeError):
            found = self.find(spelling)
        return default if found is _MISSING else dict.__getitem__(self, found)

    def __getitem__(self, spelling: Any) -> Any:
        found = self.find(spelling)
        if found is _MISSING:
            raise KeyError(spelling)
        return dict.__getitem__(self, found)

    def __contains__(self, spelling: Any) -> bool:
        return self.find(spelling) is not _MISSING

    def __delitem__(self, spelling: Any) -> None:
        found = self.find(spelling)
        if found is _MISSING:
            raise KeyError(spelling)
        self._found.clear()
        dict.__delitem__(self, found)

    def pop(self, spelling: Any, *default: Any) -> Any:
        if spelling in self:
            value = self[spelling]
            del self[spelling]
            return value
        if default:
            return default[0]
        raise KeyError(spelling)

    def clear(self) -> None:
        self._found.clear()
        dict.clear(self)


class OpSet(_OpRows, set):
    """A set of operators whose members are operator keys (see ``OpTable``): adding
    ``torch.relu`` adds ``"relu"``, and ``aten.relu.default in the_set`` is then true."""

    def __init__(
        self,
        members: Any = (),
        *,
        in_place: bool = False,
        modules: bool = False,
        aten: bool = True,
        pinned: Any = (),
    ) -> None:
        self._setup(in_place, modules, aten)
        set.__init__(self, (self.row(member) for member in members))
        set.update(self, pinned)  # these very spellings (``OpTable.pin``)

    def _has_row(self, row: Any) -> bool:
        return set.__contains__(self, row)

    def add(self, spelling: Any) -> None:
        self._found.clear()
        set.add(self, self.row(spelling))

    def discard(self, spelling: Any) -> None:
        self._found.clear()
        set.discard(self, self.row(spelling))

    def update(self, *groups: Any) -> None:
        for group in groups:
            for spelling in group:
                self.add(spelling)

    def clear(self) -> None:
        self._found.clear()
        set.clear(self)

    def __contains__(self, spelling: Any) -> bool:
        try:  # ``find``, inlined: this is the hot path
            return self._found[spelling] is not _MISSING
        except (KeyError, TypeError):
            return self.find(spelling) is not _MISSING


# --------------------------------------------------------------------- derivation
def _derive(target: Any) -> OpKey | None:
    if isinstance(target, str):
        return _from_method_name(target)
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return _from_aten(target)
    if target in RENAMED:
        return OpKey(RENAMED[target])
    if isinstance(target, type):
        return _from_module_class(target) if issubclass(target, nn.Module) else None
    entry = PYTHON_OPERATORS.get(target)
    if entry is not None:
        return _from_python_operator(entry)
    name = _names().get(target)
    return None if name is None else _normalised(name)


def _normalised(name: str) -> OpKey:
    """``"clip_"`` -> ``OpKey("clamp", True)``: the in-place suffix off, then the alias."""
    in_place = is_inplace_name(name)
    if in_place:
        name = name[:-1]
    return OpKey(ALIASES.get(name, name), in_place)


def _from_method_name(name: str) -> OpKey | None:
    entry = _HOOKS.get(name)
    if entry is not None:  # "__add__", "__radd__", "__iadd__"
        return _from_python_operator(entry)
    if name.startswith("__") or not hasattr(torch.Tensor, name):
        return None
    return _normalised(name)


def _from_aten(target: Any) -> OpKey | None:
    packet = getattr(target, "overloadpacket", target)
    namespace, _, name = packet._qualified_op_name.partition("::")
    return _normalised(name) if namespace == "aten" else None


def _from_python_operator(entry: Any) -> OpKey | None:
    if entry.kind == "augmented":
        base = op_key(entry.in_place_of)
        return None if base is None else OpKey(base.name, True)
    if entry.hook is None:  # ``not``, ``is``, ``getattr``: no tensor operation
        return None
    return OpKey(ALIASES.get(entry.hook[2:-2], entry.hook[2:-2]))


def _from_module_class(cls: type) -> OpKey | None:
    if cls in MODULE_KEYS:
        return OpKey(MODULE_KEYS[cls])
    if not cls.__module__.startswith("torch.nn.modules."):
        return None  # a user's module: what it computes is its own
    names = _function_names()
    snake = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", cls.__name__).lower()
    for candidate in (cls.__name__.lower(), snake):
        if candidate in names:
            return _normalised(candidate)
    return None


def _names() -> dict[Any, str]:
    """Every function of torch's operation namespaces -> its name there (built once)."""
    global _namespace_names
    if _namespace_names is None:
        found: dict[Any, str] = {}
        for namespace, prefix in reversed(_NAMESPACES):  # earlier namespaces win
            found.update(_functions_of(namespace, prefix))
        _namespace_names = found
    return _namespace_names


def _function_names() -> frozenset[str]:
    global _all_names
    if _all_names is None:
        _all_names = frozenset(_names().values())
    return _all_names


def _functions_of(namespace: Any, prefix: str) -> dict[Any, str]:
    # ``vars`` of a module, not ``dir``: reading torch's lazy attributes would import them.
    names = vars(namespace) if isinstance(namespace, ModuleType) else dict.fromkeys(dir(namespace))
    found = {}
    for name in names:
        if name.startswith("__"):
            continue
        value = getattr(namespace, name, None)
        if not callable(value) or isinstance(value, (type, ModuleType)):
            continue
        try:
            # One object under a public and a private name (``F._threshold``): the public wins.
            if value not in found or not name.startswith("_"):
                found[value] = prefix + name
        except TypeError:  # unhashable
            continue
    return found


def _hooks() -> dict[str, Any]:
    hooks = {}
    for entry in PYTHON_OPERATORS.values():
        for hook in (entry.hook, entry.reflected_hook):
            if hook is not None:
                hooks[hook] = entry
    return hooks


_HOOKS = _hooks()
