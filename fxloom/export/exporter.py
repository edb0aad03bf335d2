"""``export(module, args, kwargs)``: capture a module's forward as an ``ExportedProgram``.

The steps: lift the module's state (parameters ``p_*``, buffers ``b_*``) and
the user's inputs to placeholders with stand-ins for values; put the
stand-ins in the module in place of its state; run the forward under the
capture (``capture.Capture``), which records every operator functionally;
then read off the outputs: first the state and inputs the program wrote, then
what it returned. Tensors the program holds that are not state become
constants (``c_*``). The module is unchanged afterwards, whatever happens.

Depends on the IR, ``fxloom.pytree`` and the rest of ``fxloom.export``.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
from collections.abc import Iterator
from typing import Any

import torch

from fxloom import pytree
from fxloom._torch_compat import python_dispatcher
from fxloom.export import cond_capture  # noqa: F401 - loaded with export: its CAPTURES row counts
from fxloom.export.capture import Capture, ExportError, Storage
from fxloom.export.program import ExportedProgram
from fxloom.export.signature import (
    ConstantArgument,
    ExportGraphSignature,
    InputKind,
    InputSpec,
    OutputKind,
    OutputSpec,
    TensorArgument,
)
from fxloom.export.sizes.runtime_asserts import assert_deferred, assert_input_guards
from fxloom.export.verifier import verify
from fxloom.graph_module import GraphModule
from fxloom.lint import is_default_literal
from fxloom.node import Node
from fxloom.values import signature as binding
from fxloom.values.capturing import capturing
from fxloom.values.provenance import Provenance
from fxloom.values.stand_in import StandIn
from fxloom.values.symbolic.dynamic_shapes import resolve_dynamic_shapes
from fxloom.values.symbolic.input_sizes import InputSizes
from fxloom.values.symbolic.ranges import ValueRange
from fxloom.values.symbolic.shape_report import shape_constraints

__all__ = ["export", "ExportError"]

_WRITE_KIND = {
    InputKind.PARAMETER: OutputKind.PARAMETER_MUTATION,
    InputKind.BUFFER: OutputKind.BUFFER_MUTATION,
    InputKind.USER_INPUT: OutputKind.USER_INPUT_MUTATION,
}


def export(
    mod: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any] | None = None,
    *,
    dynamic_shapes: Any = None,
    strict: bool = False,
) -> ExportedProgram:
    """Capture ``mod``'s forward on ``args``/``kwargs`` as an operator-level, functional program.

    ``args`` is a tuple and ``kwargs`` a dict of the forward's inputs: tensors
    and structures of them (tuples, lists, dicts, named tuples, registered
    dataclasses and classes, classes registered with torch's pytree such as
    Hugging Face's ``ModelOutput``, and transformers' caches), and other values,
    which the program is fixed to. A None (a parameter left at its default
    included) is fixed too and is no input of the graph: the signature lists the
    inputs that carry values, as torch.export's does.
    The result is sound for inputs of the examples' shapes and dtypes:
    ``ep.module()`` checks that. ``strict`` is accepted for torch.export
    compatibility; fxloom always runs the real forward (non-strict).

        >>> import torch
        >>> from fxloom.export import export
        >>> class Scale(torch.nn.Module):
        ...     def forward(self, x):
        ...         return x * 2 + 1
        >>> print(export(Scale(), (torch.ones(3),)).graph)
        graph():
            %x : [num_users=1] = placeholder[target=x]
            %mul : [num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%x, 2), kwargs = {})
            %add : [num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%mul, 1), kwargs = {})
            return (add,)
    """
    _check_call(mod, args, kwargs, dynamic_shapes)
    kwargs = dict(kwargs or {})
    arg_names, bound = _bind(mod, tuple(args), kwargs)
    provenance = Provenance(mod, stop=sys._getframe())
    leaf_dims = iter(resolve_dynamic_shapes(arg_names, bound, dynamic_shapes))
    capture = Capture(provenance, constant_names=_tensor_attributes(mod))
    sizes = InputSizes(capture.shape_env)
    input_specs: list[InputSpec] = []
    state = _lift_state(mod, capture, input_specs)
    user_values = []
    for name, value in zip(arg_names, bound):
        lifted = _lift_user_input(name, value, capture, input_specs, leaf_dims, sizes)
        user_values.append(lifted)
    call_args, call_kwargs = _call_arguments(mod, arg_names, user_values, len(args))
    # Dynamic sizes need torch's Python kernels (composites that read sizes as ints in C++).
    dispatcher = python_dispatcher() if capture.symbolic else contextlib.nullcontext()
    capturing_export = capturing("export", provenance.modules)
    with _swapped(mod, state), capturing_export, provenance.active(), dispatcher:
        with capture.mode(), _active(capture):
            result = mod(*call_args, **call_kwargs)
    assert_deferred(capture)
    assert_input_guards(capture)
    graph_signature, out_spec = _finish(capture, input_specs, result)
    _, in_spec = binding.flatten(bound)
    state_dict, constants = _state_values(mod, input_specs, capture)
    return ExportedProgram(
        GraphModule(torch.nn.Module(), capture.graph),
        graph_signature,
        state_dict,
        constants,
        in_spec=in_spec,
        out_spec=out_spec,
        arg_names=_declared_names(mod, arg_names),
        example_inputs=(tuple(args), kwargs),
        verifier=verify,
        module_hierarchy={
            path: type(module) for path, module in mod.named_modules(remove_duplicate=False)
        },
        range_constraints=_range_constraints(capture, sizes),
        shape_env=capture.shape_env,
        shape_constraints=shape_constraints(capture.shape_env, sizes.made_static),
    )


def _range_constraints(capture: Capture, sizes: InputSizes) -> dict[Any, ValueRange]:
    """Each symbol the program still has (not replaced by another, not dropped): its declared
    range if a Dim declared one, else the range the program left it; an index width's bound
    (``symbolic.index_width``) narrows either."""
    env = capture.shape_env
    sources = capture.sizes.sources
    narrowed = {n.symbol: n.upper for n in env.index_bounds.values() if n.symbol is not None}

    def reported(symbol: Any, info: Any) -> ValueRange:
        declared = sizes.declared.get(symbol) or ValueRange(info.lower, info.upper)
        if symbol not in narrowed:
            return declared
        return ValueRange(declared.lower, min(declared.upper, info.upper))

    return {
        symbol: reported(symbol, info)
        for symbol, info in env.symbols.items()
        if symbol not in env.replacements
        # a data-dependent value the program dropped (dead code) is not one of its sizes
        and not (symbol in sources and sources[symbol][0]._erased)
    }


# ------------------------------------------------------------------ arguments


def _check_call(mod: Any, args: Any, kwargs: Any, dynamic_shapes: Any) -> None:
    if not isinstance(mod, torch.nn.Module):
        raise TypeError(
            f"export takes an nn.Module, got {type(mod).__name__}; wrap a function in a "
            "module whose forward calls it"
        )
    if not isinstance(args, tuple):
        raise TypeError(
            f"export's args must be a tuple of the forward's inputs, got {type(args).__name__}"
            " (write (x,) for one input)"
        )
    if kwargs is not None and not isinstance(kwargs, dict):
        raise TypeError(f"export's kwargs must be a dict, got {type(kwargs).__name__}")


def _bind(mod: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[list[str], list[Any]]:
    """forward's parameter names and the value each gets (defaults filled in)."""
    bound = binding.bind(mod.forward, args, kwargs, what="export: the inputs do not fit")
    return list(bound), list(bound.values())


def _declared_names(mod: torch.nn.Module, names: list[str]) -> list[str]:
    """forward's parameters as declared: ``*args`` and ``**kwargs`` keep their stars."""
    parameters = {p.name: p for p in binding.parameters_of(mod.forward)}
    stars = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}
    declared = []
    for name in names:
        parameter = parameters[name]
        default = parameter.default
        # A default the generated code can spell keeps the call optional, as it is in forward.
        if default is not parameter.empty and is_default_literal(default):
            name = f"{name}={default!r}"
        declared.append(stars.get(parameter.kind, "") + name)
    return declared


def _call_arguments(
    mod: torch.nn.Module, names: list[str], values: list[Any], positional: int
) -> tuple[tuple, dict]:
    """The stand-in inputs as the forward takes them: ``*args`` and ``**kwargs`` expanded, the
    parameters the caller passed by keyword passed so again."""
    return binding.unbind(mod.forward, dict(zip(names, values)), positional)


def _lift_user_input(
    name: str,
    value: Any,
    capture: Capture,
    specs: list[InputSpec],
    leaf_dims: Iterator[dict[int, Any]],
    sizes: InputSizes,
) -> Any:
    """Placeholders for the leaves of one forward input; the input rebuilt of stand-ins.
    ``leaf_dims`` gives each leaf's dynamic dimensions, in order. A None (an input left at
    its default, a field not given) is no placeholder: the program is fixed to it, as
    torch.export fixes inputs it is not given."""
    leaves, spec = pytree.tree_flatten(value, none_is_leaf=False)
    single = spec.is_leaf()
    lifted = []
    for index, leaf in enumerate(leaves):
        path = name if single else f"{name}_{index}"
        dims = next(leaf_dims)
        leaf_sizes = sizes.of(path, leaf, dims) if isinstance(leaf, torch.Tensor) else None
        node, stand_in = capture.placeholder(path, leaf, leaf_sizes)
        arg = (
            TensorArgument(node.name)
            if isinstance(leaf, torch.Tensor)
            else ConstantArgument(node.name, leaf)
        )
        specs.append(InputSpec(InputKind.USER_INPUT, arg))
        lifted.append(stand_in)
    return pytree.tree_unflatten(lifted, spec)


# ------------------------------------------------------------------ state


def _lift_state(
    mod: torch.nn.Module, capture: Capture, specs: list[InputSpec]
) -> dict[str, StandIn]:
    """Placeholders for parameters then buffers (a tied tensor once); name -> stand-in."""
    state: dict[str, StandIn] = {}
    seen: dict[int, StandIn] = {}
    non_persistent = _non_persistent_buffers(mod)
    members = [
        (InputKind.PARAMETER, "p_", mod.named_parameters(remove_duplicate=False)),
        (InputKind.BUFFER, "b_", mod.named_buffers(remove_duplicate=False)),
    ]
    for kind, prefix, named in members:
        for name, tensor in named:
            if tensor is None:
                continue
            if id(tensor) in seen:
                state[name] = seen[id(tensor)]
                continue
            node, stand_in = capture.placeholder(prefix + name.replace(".", "_"), tensor)
            persistent = None if kind is InputKind.PARAMETER else name not in non_persistent
            specs.append(InputSpec(kind, TensorArgument(node.name), name, persistent))
            state[name] = seen[id(tensor)] = stand_in
    return state


def _non_persistent_buffers(mod: torch.nn.Module) -> set[str]:
    return {
        f"{path}.{name}" if path else name
        for path, module in mod.named_modules(remove_duplicate=False)
        for name in module._non_persistent_buffers_set
    }


def _tensor_attributes(mod: torch.nn.Module) -> dict[int, str]:
    """Plain tensor attributes (not parameters or buffers): id -> path, for constants' names."""
    found: dict[int, str] = {}
    for path, module in mod.named_modules():
        for name, value in vars(module).items():
            if isinstance(value, torch.Tensor) and id(value) not in found:
                found[id(value)] = f"{path}.{name}" if path else name
    return found


@contextlib.contextmanager
def _swapped(mod: torch.nn.Module, state: dict[str, StandIn]) -> Iterator[None]:
    """The module's state replaced by stand-ins for the duration, put back on every path."""
    saved = []
    try:
        for name, stand_in in state.items():
            owner_path, _, field = name.rpartition(".")
            owner = mod.get_submodule(owner_path)
            table = owner._parameters if field in owner._parameters else owner._buffers
            saved.append((table, field, table[field]))
            table[field] = stand_in
        yield
    finally:
        for table, field, original in reversed(saved):
            table[field] = original


@contextlib.contextmanager
def _active(capture: Capture) -> Iterator[None]:
    previous = StandIn.active
    StandIn.active = capture.dispatch
    try:
        yield
    finally:
        StandIn.active = previous


def _state_values(
    mod: torch.nn.Module, specs: list[InputSpec], capture: Capture
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """``state_dict`` (parameters, persistent buffers) and ``constants`` (the rest), by target."""
    state_dict: dict[str, torch.Tensor] = {}
    constants: dict[str, torch.Tensor] = {}
    for spec in specs:
        if spec.kind is InputKind.PARAMETER:
            state_dict[spec.target] = mod.get_parameter(spec.target)
        elif spec.kind is InputKind.BUFFER:
            table = state_dict if spec.persistent else constants
            table[spec.target] = mod.get_buffer(spec.target)
    for constant in capture.constants.values():
        constants[constant.name] = constant.tensor
    return state_dict, constants


# ------------------------------------------------------------------ outputs


def _finish(
    capture: Capture, input_specs: list[InputSpec], result: Any
) -> tuple[ExportGraphSignature, pytree.TreeSpec]:
    """The output node (writes, then the user's outputs), constants in place, dead code gone."""
    graph = capture.graph
    leaves, out_spec = pytree.tree_flatten(result)
    user_outputs = [_output_value(capture, leaf) for leaf in leaves]
    placeholders = graph.find_nodes(op="placeholder")
    output_specs, written = [], []
    for spec, node in zip(input_specs, placeholders):
        storage = _storage_of(capture, node)
        if storage is None or storage.node is storage.initial:
            continue
        target = spec.target if spec.kind is not InputKind.USER_INPUT else node.name
        written.append(storage.node)
        output_specs.append(OutputSpec(_WRITE_KIND[spec.kind], TensorArgument(""), target))
    graph.output(tuple(written + user_outputs))
    graph.eliminate_dead_code()
    place_constants(capture, input_specs)
    output_specs = [
        OutputSpec(spec.kind, TensorArgument(node.name), spec.target)
        for spec, node in zip(output_specs, written)
    ]
    for value in user_outputs:
        arg = TensorArgument(value.name) if isinstance(value, Node) else ConstantArgument("", value)
        output_specs.append(OutputSpec(OutputKind.USER_OUTPUT, arg))
    graph.lint()
    return ExportGraphSignature(input_specs, output_specs), out_spec


def _output_value(capture: Capture, leaf: Any) -> Any:
    if isinstance(leaf, torch.Tensor):
        return capture.read(capture._input(leaf))
    return leaf


def _storage_of(capture: Capture, placeholder: Node) -> Storage | None:
    val = placeholder.meta.get("val")
    value = capture.values.get(id(val)) if isinstance(val, StandIn) else None
    return value.storage if value is not None else None


def place_constants(capture: Capture, input_specs: list[InputSpec]) -> None:
    """Constant placeholders (made as they were met, after the others) move before the user
    inputs and get their input specs; those nothing reads (after dead-code elimination) go."""
    for key, constant in list(capture.constants.items()):
        if not constant.node.users:
            capture.graph.erase_node(constant.node)
            del capture.constants[key]
    if not capture.constants:
        return
    first_user = next(
        (
            node
            for spec, node in zip(input_specs, capture.graph.find_nodes(op="placeholder"))
            if spec.kind is InputKind.USER_INPUT
        ),
        None,
    )
    at = len([s for s in input_specs if s.kind is not InputKind.USER_INPUT])
    for offset, constant in enumerate(capture.constants.values()):
        if first_user is not None:
            first_user.prepend(constant.node)
        spec = InputSpec(
            InputKind.CONSTANT_TENSOR, TensorArgument(constant.node.name), constant.name
        )
        input_specs.insert(at + offset, spec)
