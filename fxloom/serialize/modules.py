"""The module tree of a GraphModule as JSON data plus tensors, and back.

Each module is a record::

    {"class": "torch.nn.modules.linear.Linear", "training": false,
     "attributes": {"in_features": 3, "out_features": 2},
     "parameters": {"weight": <tensor record>, "bias": null},
     "buffers": {...}, "non_persistent": [...], "tensors": {...},
     "children": {"0": {...}}}

and a GraphModule adds ``"graph"`` and ``"class_name"``. A module is rebuilt
without running its ``__init__``: an empty instance of the allowlisted class
gets its attributes, parameters, buffers and children written into
``__dict__``, ``_parameters``, ``_buffers`` and ``_modules``, as ``nn.Module``'s
own bookkeeping would hold them; then ``REBUILT_HOOKS`` derives what a few
classes derive from that state (an RNN's flat weight list). No module code
runs while loading: nothing is read through ``getattr`` (a property or a
parametrization would run), and parametrizations are torch's own only
(``parametrized``). A name has one meaning: it appears once across a record's
parameters, buffers, children, tensors and attributes, and never hides a
member of the class. Saving runs the same checks on the live module first.
``MODULE_STATES`` holds the classes whose state is not plain attributes
(quantized modules' packed weights) — each with how it is written and read;
the modules backends make (ONNX Runtime sessions) are written and read by
their backend's rules (``fxloom.backends``, adapted in ``module_states``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.utils import parametrize

from fxloom.graph_module import GraphModule
from fxloom.serialize import allowlist, parametrized, rnn_weights
from fxloom.serialize.errors import SerializationError
from fxloom.serialize.frozen_tree import check_get_attr_uses
from fxloom.serialize.graphs import check_identifier, check_path, decode_graph, encode_graph
from fxloom.serialize.meta import MetaCodecs
from fxloom.serialize.module_members import MISSING, held_at
from fxloom.serialize.module_shapes import check_module_shapes, row_for
from fxloom.serialize.tensors import TensorReader, TensorWriter
from fxloom.serialize.values import decode_value, encode_value, short

__all__ = ["encode_module", "decode_module", "ModuleState", "MODULE_STATES", "REBUILT_HOOKS"]

# nn.Module's own bookkeeping and GraphModule's generated-code cache: never saved as attributes.
_MODULE_INTERNALS = frozenset(
    {
        "training",
        "_parameters",
        "_buffers",
        "_non_persistent_buffers_set",
        "_backward_pre_hooks",
        "_backward_hooks",
        "_is_full_backward_hook",
        "_forward_hooks",
        "_forward_hooks_with_kwargs",
        "_forward_hooks_always_called",
        "_forward_pre_hooks",
        "_forward_pre_hooks_with_kwargs",
        "_state_dict_hooks",
        "_state_dict_pre_hooks",
        "_load_state_dict_pre_hooks",
        "_load_state_dict_post_hooks",
        "_modules",
        "_compiled_call_impl",
    }
)
_GRAPH_MODULE_INTERNALS = frozenset(
    {"_graph", "_code", "_compiled_graph", "_compiled_version", "_source_file"}
)
# Hooks that change what a module computes are code, and refuse saving; state-dict hooks
# (for loading older checkpoints, e.g. weight_norm's) do not affect running and are left out.
_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


@dataclass(frozen=True)
class ModuleState:
    """How modules of one class are written and read, when attributes and tensors are not enough.

    ``save(module, writer, where) -> data`` returns JSON data (tensors as
    ``writer.add`` records); ``load(data, reader, where) -> module`` builds the
    module from it. Classes are matched exactly, then by their bases.
    """

    save: Callable[[nn.Module, TensorWriter, str], Any]
    load: Callable[[Any, TensorReader, str], nn.Module]


# Keyed by class, or by qualified class name for fxloom.quantize's classes, which this
# package never imports. Rows: ``module_states``. Backends' classes: ``_state_of``.
MODULE_STATES: dict[type | str, ModuleState] = {}
# Run on a module after its state is back, for what its __init__ derives from that state
# (read from its dictionaries: nothing runs through attributes).
REBUILT_HOOKS: dict[type | str, Callable[[nn.Module], None]] = {
    nn.RNNBase: rnn_weights.rebuild_flat_weights,
}
# Attributes a class derives from the others (REBUILT_HOOKS makes them again): never saved,
# and refused in a file, where they could contradict what they derive from.
DERIVED_ATTRIBUTES: dict[type, frozenset[str]] = {nn.RNNBase: rnn_weights.DERIVED}
# A module record's tables of names; a name appears in one of them at most.
_NAMED_TABLES = ("parameters", "buffers", "children", "tensors", "attributes")
# What passes attach to the GraphModules they return, about this session: its meta
# (quantize's plan and report), fxloom.lower's report. Left out when they are not data.
_SESSION_ANALYSES = frozenset({"meta", "lowering_report"})


def _state_of(cls: type) -> ModuleState | None:
    """How modules of ``cls`` are saved when attributes and tensors are not enough: its row
    of ``MODULE_STATES``, else the rule of the backend that makes them, else None."""
    return _special(cls, MODULE_STATES) or module_states.backend_state(cls)


def _special(cls: type, table: Mapping[type | str, Any]) -> Any:
    """The row of ``cls`` or of its nearest base, found by class or by qualified name."""
    return row_for(table, cls)


# ---------------------------------------------------------------------- saving
def encode_module(
    module: nn.Module, writer: TensorWriter, codecs: MetaCodecs, where: str = "the module"
) -> dict:
    """``module``'s record; ``SerializationError``, before anything is written, for whatever
    loading would refuse (the same checks, on the live module: shapes, names, parametrizations)."""
    cls = type(module)._user_class() if isinstance(module, GraphModule) else type(module)
    cls = parametrized.saved_class(module, cls)
    record: dict[str, Any] = {
        "class": allowlist.module_class_name(cls),
        "training": module.training,
    }
    if parametrized.parametrized_names(module):
        record["parametrized"] = parametrized.parametrized_names(module)
    state = _state_of(cls)
    if state is not None:
        record["state"] = state.save(module, writer, where)
        return record
    _refuse_hooks(module, cls, where)
    _check_saveable(module, cls, where)
    if isinstance(module, GraphModule):
        _encode_graph(module, record, writer, codecs, where)
    attributes, tensors = _encode_attributes(module, cls, writer, where)
    record["attributes"] = attributes
    if tensors:
        record["tensors"] = tensors
    record["parameters"] = {
        name: None if p is None else writer.add(p, f"{where}.{name}")
        for name, p in module._parameters.items()
    }
    record["buffers"] = {
        name: None if b is None else writer.add(b, f"{where}.{name}")
        for name, b in module._buffers.items()
    }
    if module._non_persistent_buffers_set:
        record["non_persistent"] = sorted(module._non_persistent_buffers_set)
    _check_one_meaning(record, where)
    _check_saved_names(module, record, where)
    record["children"] = {
        name: None if child is None else encode_module(child, writer, codecs, f"{where}.{name}")
        for name, child in module._modules.items()
    }
    return record


def _refuse_hooks(module: nn.Module, cls: type, where: str) -> None:
    for hooks in _HOOKS:
        if vars(module).get(hooks):
            raise SerializationError(
                f"cannot save {where} ({cls.__qualname__}): it has {hooks[1:]} registered, which "
                "are Python code; remove them before saving"
            )


def _check_saveable(module: nn.Module, cls: type, where: str) -> None:
    """What loading checks of a rebuilt module, checked of ``module`` before saving it."""
    try:
        if type(module) is parametrize.ParametrizationList:
            parametrized.check_parametrization_list(module, where)
        check_module_shapes(module, where)
    except SerializationError as e:
        raise SerializationError(f"cannot save {e}") from None
    if isinstance(module, nn.RNNBase) and parametrized.parametrized_names(module):
        raise SerializationError(
            f"cannot save {where}: an RNN runs on its flat weights, not through parametrizations"
        )


def _encode_graph(
    module: GraphModule, record: dict, writer: TensorWriter, codecs: MetaCodecs, where: str
) -> None:
    record["class_name"] = type(module).__name__
    record["graph"] = encode_graph(module.graph, codecs)
    for node in module.graph.find_nodes(op="get_attr"):  # what loading checks (frozen_tree)
        value = held_at(module, node.target)
        if value is not MISSING:
            try:
                check_get_attr_uses(node, value, where)
            except SerializationError as e:
                raise SerializationError(f"cannot save {e}") from None
    constants = module.graph.constants
    if constants:
        record["graph_constants"] = {
            k: _encode_graph_constant(module, k, v, writer, where) for k, v in constants.items()
        }


def _encode_attributes(
    module: nn.Module, cls: type, writer: TensorWriter, where: str
) -> tuple[dict, dict]:
    """The module's plain attributes: data, and tensors (written apart)."""
    internals = _MODULE_INTERNALS | _derived(cls)
    if isinstance(module, GraphModule):
        internals = internals | _GRAPH_MODULE_INTERNALS
    attributes, tensors = {}, {}
    for name, value in module.__dict__.items():
        if name in internals or name in module._modules:  # mirrored submodules
            continue
        if isinstance(value, torch.Tensor):
            tensors[name] = writer.add(value, f"{where}.{name}")
        elif isinstance(value, nn.Module):
            raise SerializationError(f"cannot save {where}.{name}: a module outside _modules")
        elif (cls, name) in parametrized.ENUM_ATTRIBUTES:
            attributes[name] = value.name
        else:
            try:
                attributes[name] = encode_value(value, f"{where}.{name}")
            except SerializationError as e:
                if name in _SESSION_ANALYSES and isinstance(module, GraphModule):
                    continue  # analyses of this session, not needed to run: left out
                raise SerializationError(f"cannot save the attribute {where}.{name}: {e}") from None
    return attributes, tensors


def _derived(cls: type) -> frozenset[str]:
    return _special(cls, DERIVED_ATTRIBUTES) or frozenset()


def _check_one_meaning(record: dict, where: str) -> None:
    """A name appears once across a module's parameters, buffers, children, tensors and
    attributes: otherwise its forward would use one thing while its state_dict shows another."""
    seen: dict[str, str] = {}
    for table in _NAMED_TABLES:
        for name in _mapping(record, table, where):
            if name in seen:
                raise SerializationError(
                    f"{where}: {name!r} is among both its {seen[name]} and its {table}; a name "
                    "has one meaning in a module"
                )
            seen[name] = table


def _check_saved_names(module: nn.Module, record: dict, where: str) -> None:
    """The names loading checks (``_check_member``, ``_check_attribute``: plain ASCII), checked
    before anything is written."""
    try:
        for name in (*module._parameters, *module._buffers, *module._modules):
            check_path(name, f"{where}: the member name")
        for name in (*record["attributes"], *record.get("tensors", ())):
            check_identifier(name, f"{where}: the attribute name")
    except SerializationError as e:
        raise SerializationError(f"cannot save {e}; rename it") from None


def _encode_graph_constant(
    module: GraphModule, name: str, value: Any, writer: TensorWriter, where: str
) -> Any:
    """A tensor, or a submodule the graph also holds (a branch of ``fxloom.cond``) by name."""
    if isinstance(value, nn.Module):
        if module._modules.get(name) is not value:
            raise SerializationError(
                f"cannot save {where}.graph.constants[{name!r}]: a module that is not a submodule"
            )
        return {"submodule": name}
    return writer.add(value, f"{where}.graph.constants[{name!r}]")


def _decode_graph_constant(
    module: GraphModule, name: str, record: Any, reader: TensorReader, where: str
) -> Any:
    if isinstance(record, dict) and set(record) == {"submodule"}:
        child = module._modules.get(record["submodule"]) if record["submodule"] == name else None
        if child is None:
            raise SerializationError(f"{where}: graph constant {name!r} names no submodule")
        return child
    tensor = reader.get(record, f"{where}.graph.constants[{name!r}]")
    # One name, one meaning: the graph's constant is the module's tensor of that name, if any.
    held = module.__dict__.get(name, tensor)
    if (
        name in module._parameters
        or name in module._buffers
        or name in module._modules
        or (held is not tensor)
    ):
        raise SerializationError(
            f"{where}: the graph constant {name!r} is another tensor than the module's {name!r}; "
            "a name has one meaning in a module"
        )
    return tensor


# --------------------------------------------------------------------- loading
def decode_module(
    data: Any, reader: TensorReader, codecs: MetaCodecs, where: str = "module", depth: int = 0
) -> nn.Module:
    """The module ``data`` records, its state written into its dictionaries: no ``__init__``,
    no ``forward``, no attribute read through a descriptor or parametrization runs."""
    if not isinstance(data, dict):
        raise SerializationError(f"{where}: expected a module record")
    if depth > 100:
        raise SerializationError(f"{where}: modules are nested more than 100 deep")
    cls = allowlist.resolve_module_class(data.get("class"))
    training = data.get("training", False)
    if not isinstance(training, bool):
        raise SerializationError(f"{where}: 'training' must be true or false")
    state = _state_of(cls)
    if state is not None:
        module = state.load(data.get("state"), reader, where)
        if not isinstance(module, cls):
            raise SerializationError(
                f"{where}: rebuilt a {type(module).__name__}, not a {cls.__name__}"
            )
        return module.train(training)
    _check_one_meaning(data, where)
    is_graph_module = issubclass(cls, GraphModule)
    module = _empty(cls, data, where) if is_graph_module else _empty_module(cls)
    module.training = training
    _decode_attributes(module, cls, data, reader, where)
    _decode_tensors(module, cls, data, reader, where)
    for name, child in _mapping(data, "children", where).items():
        _check_member(cls, name, f"{where}: submodule")
        module._modules[name] = (
            None
            if child is None
            else decode_module(child, reader, codecs, f"{where}.{name}", depth + 1)
        )
    _rebuild(module, cls, data, where)
    if is_graph_module:
        graph = decode_graph(data.get("graph"), codecs, f"{where}.graph")
        for name, record in _mapping(data, "graph_constants", where).items():
            graph.constants[name] = _decode_graph_constant(module, name, record, reader, where)
        from fxloom._mirrored_modules import mirror

        mirror(module)
        module.graph = graph
    return module


def _decode_attributes(
    module: nn.Module, cls: type, data: dict, reader: TensorReader, where: str
) -> None:
    derived = _derived(cls)
    for name, value in _mapping(data, "attributes", where).items():
        _check_attribute(cls, name, where)
        if name in derived:
            raise SerializationError(
                f"{where}: the attribute {name!r} is derived from the others on loading; a "
                "file does not set it"
            )
        enum = parametrized.ENUM_ATTRIBUTES.get((cls, name))
        if enum is not None:
            module.__dict__[name] = _enum_member(enum, value, f"{where}.{name}")
        else:
            module.__dict__[name] = decode_value(value, None, f"{where}.{name}")
    for name, record in _mapping(data, "tensors", where).items():
        _check_attribute(cls, name, where)
        module.__dict__[name] = reader.get(record, f"{where}.{name}")


def _enum_member(enum: type, name: Any, where: str) -> Any:
    if not isinstance(name, str) or name not in enum.__members__:
        raise SerializationError(f"{where}: must be one of {list(enum.__members__)}")
    return enum.__members__[name]


def _decode_tensors(
    module: nn.Module, cls: type, data: dict, reader: TensorReader, where: str
) -> None:
    for name, record in _mapping(data, "parameters", where).items():
        _check_member(cls, name, f"{where}: parameter")
        tensor = None if record is None else reader.get(record, f"{where}.{name}")
        if tensor is not None and not isinstance(tensor, nn.Parameter):
            tensor = nn.Parameter(tensor, requires_grad=tensor.requires_grad)
        module._parameters[name] = tensor
    for name, record in _mapping(data, "buffers", where).items():
        _check_member(cls, name, f"{where}: buffer")
        module._buffers[name] = None if record is None else reader.get(record, f"{where}.{name}")
    non_persistent = data.get("non_persistent", [])
    if not isinstance(non_persistent, list) or not all(
        isinstance(name, str) and name in module._buffers for name in non_persistent
    ):
        raise SerializationError(f"{where}: non-persistent buffers must be among the buffers")
    module._non_persistent_buffers_set.update(non_persistent)


def _rebuild(module: nn.Module, cls: type, data: dict, where: str) -> None:
    """What follows from the state: checks of parametrizations, parametrized properties, and
    what ``REBUILT_HOOKS`` derives."""
    if cls is parametrize.ParametrizationList:
        parametrized.check_parametrization_list(module, where)
    if "parametrized" in data:
        if issubclass(cls, nn.RNNBase):
            raise SerializationError(f"{where}: an RNN's weights cannot be parametrized")
        parametrized.restore_parametrizations(module, data["parametrized"], where)
    hook = _special(cls, REBUILT_HOOKS)
    if hook is not None:
        try:
            hook(module)
        except Exception as e:
            raise SerializationError(f"{where}: cannot rebuild {cls.__qualname__}: {e}") from None


def _check_member(cls: type, name: Any, where: str) -> None:
    """A parameter, buffer or submodule name: one part of a path (``weight``, ``0``) that the
    class does not define, as ``register_parameter`` and friends require (``self.name`` would
    find the class's instead)."""
    if (cls, name) in _MEMBER_NAMES:
        return
    if not isinstance(name, str) or "." in name:
        raise SerializationError(f"{where} {short(name)} is not a name")
    check_path(name, where)
    if inspect.getattr_static(cls, name, _ABSENT) is not _ABSENT:
        raise SerializationError(f"{where} {name!r} would hide {cls.__qualname__}.{name}")
    _MEMBER_NAMES.add((cls, name))


_ABSENT = object()
# (class, name) pairs already checked as member names: a model repeats a few classes.
_MEMBER_NAMES: set[tuple[type, Any]] = set()


def _check_attribute(cls: type, name: Any, where: str) -> None:
    """Plain data attributes only: not nn.Module's bookkeeping, and nothing that would
    stand in for a method or property of the class (``forward``)."""
    if (cls, name) in _SETTABLE:
        return
    check_identifier(name, f"{where}: attribute")
    if name.startswith("__") or name in _MODULE_INTERNALS or name in _GRAPH_MODULE_INTERNALS:
        raise SerializationError(f"{where}: the attribute {name!r} is internal and cannot be set")
    defined = inspect.getattr_static(cls, name, None)
    if callable(defined) or hasattr(defined, "__get__"):
        raise SerializationError(
            f"{where}: the attribute {name!r} would replace {cls.__qualname__}.{name}"
        )
    _SETTABLE.add((cls, name))


# (class, attribute name) pairs already checked: a model has many modules of a few classes.
_SETTABLE: set[tuple[type, str]] = set()


def _empty_module(cls: type) -> nn.Module:
    module = cls.__new__(cls)
    nn.Module.__init__(module)
    return module


def _empty(cls: type, data: dict, where: str) -> GraphModule:
    class_name = data.get("class_name", "GraphModule")
    check_identifier(class_name, f"{where}: class name")
    from fxloom.graph import Graph

    return cls(nn.Module(), Graph(), class_name)


def _mapping(data: dict, key: str, where: str) -> dict:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise SerializationError(f"{where}: {key} must be an object, found {short(value)}")
    return value


# The rows of MODULE_STATES and REBUILT_HOOKS, and backends' rules (that file imports this
# one's names).
from fxloom.serialize import module_states  # noqa: E402
