"""Shape propagation: run a graph and record each node's tensor shape, dtype and layout.

``ShapeProp(gm).propagate(*args)`` runs ``gm``'s graph node by node (it is an
``Interpreter``) and stores in every node's ``meta``:

* ``meta["tensor_meta"]``: a ``TensorMetadata`` (shape, dtype, requires_grad, stride,
  memory_format, is_quantized, qparams) when the node's value is a tensor; for a tuple, list,
  named tuple or dict holding tensors (``(out, (h, c))``, a Hugging Face ``ModelOutput``), the
  same nesting with a ``TensorMetadata`` in place of each tensor (named tuples keep their type,
  other dicts become plain dicts, non-tensor items are kept as they are; containers are those of
  ``fxloom.pytree``, so registered dataclasses are described too). A value holding no
  tensor (an int, a ``torch.Size``, ``None``) gets no ``tensor_meta``, and one left by an
  earlier run is removed.
* ``meta["type"]``: the Python type of the node's value.

**Meta mode.** ``ShapeProp(gm).propagate_meta(*specs)`` does the same on stand-ins
(``fxloom.values.stand_in``: tensors with metadata and no data, the ones export and tracing with
example inputs use): no data, no compute, no memory beyond the graph's metadata; a ResNet-50 at
any batch takes a few milliseconds, as results are remembered by the metadata of each call, so
repeated layers cost one meta kernel call. Inputs may be tensors (on any device; only their
shape, dtype, strides and ``requires_grad`` are used), ``(shape, dtype)`` pairs, or
``torch.Size`` values (float32). Weights are read as stand-ins of themselves; the real weights
are neither copied nor touched, and in-place updates (batch norm statistics) reach no real
tensor. Devices named in the graph (``x.to("cuda")``, ``device=...``) become the CPU, and tensor
factories make stand-ins. The output is returned as meta tensors. Meta mode records what a real
run on the CPU records (``tensor_meta`` holds no device): where the CPU kernel lays its output
out differently from the meta kernel, ``META_FUNCTIONS`` (a table keyed by call_function
target, which users can extend) runs a stand-in, as for ``F.scaled_dot_product_attention``. An
operator with no meta kernel, or one that needs the data (``nonzero``, ``.item()``,
``.tolist()``, a branch on a value), raises a ``ShapePropError`` naming the node: give it a
``META_FUNCTIONS`` entry, or propagate in real mode. (The first meta run in a process takes a
few seconds more while torch loads its Python meta kernels.)

**Exported programs.** ``ShapeProp(ep)`` takes an ``ExportedProgram`` (``fxloom.export``) and
runs its ATen graph, ``ep.graph_module``: the placeholders that lift parameters, buffers and
constants are bound to the program's own tensors, so only the user inputs are passed, as to
``ep.module()`` (by position or by name). In meta mode an input left out falls back to what
export recorded for it, ``node.meta["val"]``: ``ShapeProp(ep).propagate_meta()`` re-derives every
shape from the export's examples, and ``ShapeProp(ep.graph_module).propagate_meta()`` works
too. An exported graph is specialised to its examples' shapes (its views carry their sizes): for
another input shape, export again.

**Shapes capture recorded.** ``record_captured_shapes(gm.graph)`` writes the same
``tensor_meta``/``type`` from the values export stamped on every node (``meta["val"]``) without
running anything, when they are all there with fixed sizes; consumers (``lower``,
``analyze_cost``) try it first and propagate only when it returns False (a traced module, or
symbolic sizes). ``translate`` always runs the graph: it needs the values, not only the shapes.

What the pass does to a module: ``node.meta["tensor_meta"]`` and ``node.meta["type"]`` are
added or overwritten on every node that runs (all of them, unless ``run`` is given an
``initial_env``); every other key is kept; node names, the graph and the module are unchanged.
The metadata is written only once the whole graph has run: a run that fails leaves every
node's ``meta`` as it was.

Depends on: ``fxloom.interpreter``; ``fxloom.values.metadata_mode`` for meta mode; ``fxloom.export``'s program
and signature (through ``passes.captured``) for exported programs.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from fxloom import attr_path
from fxloom._format import describe_target
from fxloom.codegen import CodeGen
from fxloom.export.program import ExportedProgram
from fxloom.interpreter import Interpreter
from fxloom.node import Node, Target, map_arg
from fxloom.ops.runtime_functions import stays_on_host
from fxloom.passes._meta_device import META_FUNCTIONS, MetaRunner, meta_input
from fxloom.passes.captured import graph_module_of, lifted_state
from fxloom.pytree import SEQUENCE_KINDS, container_type, tree_any, tree_map
from fxloom.values.metadata_mode import MetadataMode, holds_tensor
from fxloom.values.stand_in import StandIn
from fxloom.values.symbolic_scalars import has_symbolic_size, is_symbolic

__all__ = [
    "META_FUNCTIONS",
    "ShapeProp",
    "ShapePropError",
    "TensorMetadata",
    "extract_tensor_metadata",
    "record_captured_shapes",
]


class TensorMetadata(NamedTuple):
    """What shape propagation records about one tensor.

    ``memory_format`` is the first of ``torch.contiguous_format``, ``torch.channels_last`` and
    ``torch.channels_last_3d`` the tensor is contiguous in, else ``None``. ``qparams`` is empty
    unless ``is_quantized``; then it holds ``qscheme``, ``scale`` and ``zero_point`` (lists, and
    ``axis``, for per-channel schemes).
    """

    shape: torch.Size
    dtype: torch.dtype
    requires_grad: bool
    stride: tuple[int, ...]
    memory_format: torch.memory_format | None
    is_quantized: bool
    qparams: dict[str, Any]


_MEMORY_FORMATS = (torch.contiguous_format, torch.channels_last, torch.channels_last_3d)
_PER_TENSOR_SCHEMES = (torch.per_tensor_affine, torch.per_tensor_symmetric)


def extract_tensor_metadata(tensor: torch.Tensor) -> TensorMetadata:
    """The ``TensorMetadata`` of ``tensor`` (works on meta tensors too).

    >>> import torch
    >>> from fxloom.passes.shape_prop import extract_tensor_metadata
    >>> meta = extract_tensor_metadata(torch.zeros(2, 3).t())
    >>> meta.shape, meta.stride, meta.memory_format
    (torch.Size([3, 2]), (1, 3), None)
    """
    memory_format = None
    for candidate in _MEMORY_FORMATS:
        if tensor.is_contiguous(memory_format=candidate):
            memory_format = candidate
            break
    is_quantized = tensor.is_quantized
    return TensorMetadata(
        shape=tensor.shape,
        dtype=tensor.dtype,
        requires_grad=tensor.requires_grad,
        stride=tensor.stride(),
        memory_format=memory_format,
        is_quantized=is_quantized,
        qparams=_quantization_parameters(tensor) if is_quantized else {},
    )


def _quantization_parameters(tensor: torch.Tensor) -> dict[str, Any]:
    scheme = tensor.qscheme()
    if scheme in _PER_TENSOR_SCHEMES:
        return {"qscheme": scheme, "scale": tensor.q_scale(), "zero_point": tensor.q_zero_point()}
    return {
        "qscheme": scheme,
        "scale": tensor.q_per_channel_scales().tolist(),
        "zero_point": tensor.q_per_channel_zero_points().tolist(),
        "axis": tensor.q_per_channel_axis(),
    }


def _describe(value: Any) -> Any:
    """``value`` with each tensor replaced by its ``TensorMetadata``, nesting kept.

    Containers are rebuilt in ``fxloom.pytree``'s ``"plain"`` form: named tuples
    keep their type, dicts of any kind become plain dicts.
    """
    return tree_map(_tensor_metadata, value, mode="plain")


def _meta_form(value: Any) -> Any:
    return value._meta if isinstance(value, StandIn) else value


def _tensor_metadata(value: Any) -> Any:
    return extract_tensor_metadata(value) if isinstance(value, torch.Tensor) else value


class ShapePropError(RuntimeError):
    """A node failed while shapes were propagated; the message names it and says what to do."""


class ShapeProp(Interpreter):
    """Record each node's ``tensor_meta`` and ``type`` by running the graph (see the module doc).

    ``propagate(*args, **kwargs)`` runs on real tensors, ``propagate_meta(*specs, **kwargs)``
    on the meta device; both return what the graph returns. Inputs may be given by position,
    in placeholder order, or by name.

    Example::

        >>> import torch, fxloom
        >>> from fxloom.passes.shape_prop import ShapeProp
        >>> gm = fxloom.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU()))
        >>> _ = ShapeProp(gm).propagate_meta(((32, 4), torch.float32))
        >>> for node in gm.graph.nodes:
        ...     print(node.name, tuple(node.meta["tensor_meta"].shape), node.meta["type"].__name__)
        input_1 (32, 4) Tensor
        _0 (32, 8) Tensor
        _1 (32, 8) Tensor
        output (32, 8) Tensor
    """

    def __init__(
        self, module: torch.nn.Module | ExportedProgram, garbage_collect_values: bool = True
    ) -> None:
        # An ExportedProgram: its graph module runs, its lifted state is bound by the pass.
        self._lifted = {name: lifted.tensor for name, lifted in lifted_state(module).items()}
        super().__init__(graph_module_of(module), garbage_collect_values)
        self._bound: dict[str, Any] | None = None  # inputs by placeholder target, while running
        self._meta_runner: MetaRunner | None = None  # set while running in meta mode
        self._recorded: dict[Node, Any] = {}

    # ---------------------------------------------------------------- entry points
    def propagate(self, *args: Any, **kwargs: Any) -> Any:
        """Run on ``args``/``kwargs`` (real tensors); record metadata; return the output."""
        self._bound = self._bind_inputs(self._flattened(args, kwargs), kwargs, "propagate")
        try:
            return self.run()
        finally:
            self._bound = None

    def propagate_meta(self, *args: Any, **kwargs: Any) -> Any:
        """Run on the meta device from tensors or ``(shape, dtype)`` specs; return meta output.

        >>> import torch, fxloom
        >>> from fxloom.passes.shape_prop import ShapeProp
        >>> gm = fxloom.symbolic_trace(torch.nn.Conv2d(3, 8, 3, stride=2))
        >>> ShapeProp(gm).propagate_meta(torch.Size([4096, 3, 224, 224])).shape
        torch.Size([4096, 8, 111, 111])
        """
        args = self._flattened(args, kwargs)
        bound = self._bind_inputs(args, kwargs, "propagate_meta", recorded_defaults=True)
        for name, value in bound.items():
            bound[name] = self._to_meta(name, value)
        self._bound = bound
        self._meta_runner = MetaRunner()
        try:
            # Every operator runs on stand-ins: weights and other real tensors are read as
            # stand-ins of themselves, tensor factories make stand-ins, nothing real changes.
            with MetadataMode():
                result = self.run()
            # What meta mode has always returned: meta tensors (a stand-in's own form).
            return tree_map(_meta_form, result, mode="plain")
        finally:
            self._bound = None
            self._meta_runner = None

    def run(self, *args: Any, initial_env: dict[Node, Any] | None = None, **options: Any) -> Any:
        """``Interpreter.run``, then write the recorded metadata into the nodes' ``meta``."""
        self._recorded = {}
        try:
            if self._bound is None:
                result = super().run(*args, initial_env=initial_env, **options)
            else:  # inputs bound by placeholder already: only the output is processed
                result = super().run(initial_env=initial_env, enable_io_processing=False)
                result = self.graph.process_outputs(result)
            for node, value in self._recorded.items():
                _store(node, value)
            return result
        finally:
            self._recorded = {}

    # ------------------------------------------------------------------ per node
    def run_node(self, n: Node) -> Any:
        """Run ``n`` and remember its value's metadata; a failure raises ``ShapePropError``."""
        try:
            value = super().run_node(n)
        except ShapePropError:
            raise
        except Exception as error:
            raise ShapePropError(self._explain_failure(n, error)) from error
        # Described now, while the value is alive (the interpreter may release it right after).
        value_type = torch.Tensor if type(value) is StandIn else type(value)
        self._recorded[n] = (_describe(value) if holds_tensor(value) else None, value_type)
        return value

    def placeholder(self, target: Target, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The input bound to this placeholder by ``propagate``/``propagate_meta``."""
        if self._bound is None:  # called through run(*args) directly
            return super().placeholder(target, args, kwargs)
        return self._bound[str(target)]

    def call_function(self, target: Target, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """``target(*args, **kwargs)``; on the meta device, with devices sent to meta."""
        if self._meta_runner is not None:
            args, kwargs = MetaRunner.to_meta_device(args, kwargs)
            target = META_FUNCTIONS.get(target, target)
        return super().call_function(target, args, kwargs)

    def call_method(self, target: Target, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """``args[0].<target>(...)``; on the meta device, device moves stay on meta."""
        runner = self._meta_runner
        if runner is not None:
            if runner.method_on_meta(str(target), args):
                return args[0]
            args, kwargs = runner.to_meta_device(args, kwargs, method=str(target))
        return super().call_method(target, args, kwargs)

    # ------------------------------------------------------------------ helpers
    def _flattened(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        """The placeholders' values for a graph taking nested inputs (a pytree ``CodeGen``,
        ``ExportedProgram.module()``): ``args`` as its generated code flattens them."""
        if kwargs or type(self.graph._codegen).process_inputs is CodeGen.process_inputs:
            return args
        return tuple(self.graph.process_inputs(*args))

    def _bind_inputs(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        method: str,
        recorded_defaults: bool = False,
    ) -> dict[str, Any]:
        """Map every placeholder target to its input: by position, by name, or its default.

        Lifted state of an exported program is bound to the program's tensors; with
        ``recorded_defaults``, an input given no value takes its ``meta["val"]``.
        Not ``values.signature.bind``, on purpose: the parameters are the graph's placeholders
        (lifted state only by name, export's recorded values as defaults), not a signature.
        """
        bound: dict[str, Any] = {}
        names: list[str] = []
        used = 0  # positional arguments taken so far
        extra = dict(kwargs)
        variadic_keywords = None
        for node in self.graph.find_nodes(op="placeholder"):
            target = str(node.target)
            if target.startswith("**"):
                variadic_keywords = target
                continue
            if target.startswith("*"):
                bound[target], used = tuple(args[used:]), len(args)
                continue
            if target in self._lifted:  # never taken by position: the user inputs are
                bound[target] = extra.pop(target) if target in extra else self._lifted[target]
                continue
            names.append(target)
            if used < len(args):
                if target in extra:
                    raise TypeError(f"ShapeProp.{method}: input {target!r} given twice")
                bound[target], used = args[used], used + 1
            elif target in extra:
                bound[target] = extra.pop(target)
            elif node.args:
                bound[target] = node.args[0]  # the placeholder's default
            elif recorded_defaults and "val" in node.meta:
                bound[target] = node.meta["val"]  # what export recorded for it
        _check_binding(method, names, bound, len(args) - used, extra, variadic_keywords)
        if variadic_keywords is not None:
            bound[variadic_keywords] = extra
        return bound

    def _to_meta(self, name: str, value: Any) -> Any:
        try:
            return meta_input(value, f"input {name!r}")
        except NotImplementedError as error:
            raise ShapePropError(f"ShapeProp.propagate_meta: {error}") from error

    def _explain_failure(self, node: Node, error: Exception) -> str:
        try:
            args, kwargs = self.fetch_args_kwargs_from_env(node)
            given = _summarise((args, kwargs) if kwargs else args)
        except Exception:  # the failure was in fetching the arguments themselves
            given = "(arguments unavailable)"
        message = (
            f"ShapeProp: %{node.name} ({node.op} {describe_target(node)}) failed on "
            f"{given}: {type(error).__name__}: {_first_line(error)}"
        )
        if self._meta_runner is not None:
            message += (
                f". %{node.name} ran on the meta device (no data): if it works on real tensors, "
                "its operator has no meta kernel or needs the data (nonzero, .item(), .tolist(), "
                "a branch on a value); propagate in real mode, ShapeProp(gm).propagate(*inputs), "
                "or give the target a stand-in in fxloom.passes.shape_prop.META_FUNCTIONS"
            )
        return message


def _check_binding(
    method: str,
    names: list[str],
    bound: dict[str, Any],
    unused_positional: int,
    extra: dict[str, Any],
    variadic_keywords: str | None,
) -> None:
    signature = ", ".join(names) or "no inputs"
    if unused_positional:
        given = len(names) + unused_positional
        raise TypeError(
            f"ShapeProp.{method}: the graph takes {len(names)} positional input(s) "
            f"({signature}) but {given} were given; pass one value per input"
        )
    missing = [name for name in names if name not in bound]
    if missing:
        raise TypeError(
            f"ShapeProp.{method}: no value for input(s) {', '.join(map(repr, missing))} "
            f"(the graph takes: {signature}); pass them by position or by name"
        )
    if extra and variadic_keywords is None:
        raise TypeError(
            f"ShapeProp.{method}: unexpected input(s) {', '.join(map(repr, extra))}; "
            f"the graph takes: {signature}"
        )


def record_captured_shapes(graph: Any) -> bool:
    """Write ``tensor_meta``/``type`` from the values capture recorded, without running.

    Export stamps every node's ``meta["val"]`` (a stand-in with the shape and dtype the node
    computes); where every node of ``graph`` has one with fixed sizes, this records what
    ``ShapeProp(gm).propagate(*examples)`` would (strides as the meta kernels lay them out) and
    returns True. Otherwise it writes nothing and returns False, and the caller propagates:
    a traced module has no values, and symbolic sizes say nothing about the examples' sizes.
    Run-time checks (``stays_on_host``) return None and need no value.
    """
    recorded: dict[Node, tuple[Any, type]] = {}
    root = graph.owning_module
    for node in graph.nodes:
        if node.op == "get_attr" and root is not None:
            value = attr_path.find(root, str(node.target))  # the weight itself: no run needed
        elif node.op == "output":
            if any("val" not in n.meta for n in node.all_input_nodes):
                return False
            value = map_arg(node.args[0], lambda n: n.meta["val"])
        elif "val" in node.meta:
            value = node.meta["val"]
        elif node.op == "call_function" and stays_on_host(node.target):
            value = None
        else:
            return False
        if tree_any(_symbolic, value):
            return False
        value_type = torch.Tensor if type(value) is StandIn else type(value)
        recorded[node] = (_describe(value) if holds_tensor(value) else None, value_type)
    for node, entry in recorded.items():
        _store(node, entry)
    return True


def _symbolic(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return has_symbolic_size(value)
    return is_symbolic(value)


def _store(node: Node, recorded: tuple[Any, type]) -> None:
    tensor_meta, value_type = recorded
    meta = node.meta
    if tensor_meta is None:
        meta.pop("tensor_meta", None)
    else:
        meta["tensor_meta"] = tensor_meta
    meta["type"] = value_type


def _summarise(value: Any) -> str:
    """A short description of argument values: tensors as ``Tensor[2, 3] float32 (meta)``."""
    if isinstance(value, torch.Tensor):
        device = f" ({value.device.type})" if value.device.type != "cpu" else ""
        if isinstance(value, StandIn):  # meta mode: no data
            device = " (stand-in)"
        shape = ", ".join(str(size) for size in value.shape)
        return f"Tensor[{shape}] {str(value.dtype).removeprefix('torch.')}{device}"
    entry = container_type(type(value))
    kind = entry.kind if entry is not None else None
    if kind == "dict":
        return "{" + ", ".join(f"{k}={_summarise(v)}" for k, v in value.items()) + "}"
    if kind in SEQUENCE_KINDS:
        inner = ", ".join(_summarise(item) for item in value)
        return f"[{inner}]" if kind == "list" else f"({inner})"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else "(no message)"
