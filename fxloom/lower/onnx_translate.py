"""Translate an fxloom graph into an ONNX model, and write it to a file (``to_onnx``).

``translate(gm, example_inputs)`` takes a GraphModule, an exported program or a plain module
(traced on the examples: ``fxloom.passes.captured.program_to_read``). It runs the graph once on
the examples (``ShapeProp``, which records every node's ``tensor_meta``; the run is needed even
where export recorded each node's shape, because the translator folds the values the examples
fix, which only a real run computes), then walks it in order:

* a placeholder holding a tensor becomes a graph input (named after the forward parameter);
  the placeholders an exported program lifts (parameters, buffers, constants) become
  initializers, as do ``get_attr`` tensors;
* a node whose value the examples fix is folded into a Python value: sizes, dtypes, flags, and
  tensors computed from no input (``torch.arange(seq_len)``, a mask built from weights). With
  ``dynamic_shapes`` (or ``dynamic_batch``) the graph also runs with each dynamic dimension at
  another size (``fxloom.lower.dynamic_dims``), and a value that changes with it is computed in
  the ONNX graph (``Shape``, ``Gather``, ``Mul`` ...) instead; the dimensions that change are
  symbolic in the graph's inputs and outputs, named after their ``Dim``;
* fxloom's run-time checks (``stays_on_host``: tracing's guards, export's input checks) are
  dropped (ONNX Runtime checks input types and ranks itself; ``lower`` keeps them in PyTorch);
* every other call node goes to its handler in ``ONNX_TRANSLATIONS`` (``onnx_ops``);
* the output's tensors, flattened, become the graph outputs ``output_0``, ``output_1`` ...

A node that cannot be translated is reported by ``unsupported_reason``; ``translate`` and
``to_onnx`` raise one ``UnsupportedNodeError`` listing all of them with their source lines.

onnx is imported when a function here is called, not when the module is imported.

Depends on: ``fxloom.passes.shape_prop``, ``fxloom.export`` (programs), ``onnx_ops``; onnx.
"""

from __future__ import annotations

import itertools
import os
from typing import Any

import torch

from fxloom._format import describe_target
from fxloom.backends import UntranslatableNodesError
from fxloom.export.program import ExportedProgram
from fxloom.graph_module import GraphModule
from fxloom.lower.dynamic_dims import SizeRun, dim_names, run_failed, runs_for
from fxloom.lower.extra import require
from fxloom.lower.onnx_ops import (
    UnsupportedArgument,
    handler_for,
    has_onnx_dtype,
    onnx_dtype,
)
from fxloom.node import Node, map_arg
from fxloom.ops.runtime_functions import stays_on_host
from fxloom.passes.captured import graph_module_of, lifted_state, program_to_read
from fxloom.passes.shape_prop import ShapeProp, TensorMetadata
from fxloom.pytree import tree_leaves
from fxloom.source_location import source_location

__all__ = [
    "TranslationContext",
    "UnsupportedNodeError",
    "to_onnx",
    "translate",
    "translate_at_sizes",
    "unsupported_reason",
]


class UnsupportedNodeError(UntranslatableNodesError):
    """Some nodes of a graph have no ONNX translation; ``nodes`` lists ``(node, reason)``."""

    def __init__(self, unsupported: list[tuple[Node, str]]) -> None:
        lines = [f"{len(unsupported)} node(s) cannot be translated to ONNX:"]
        for node, reason in unsupported:
            lines.append(f"  %{node.name} ({describe_target(node)}): {reason}")
            where = _source_line(node)
            if where:
                lines.append(f"      at {where}")
        lines.append(
            "Register a handler in fxloom.lower.ONNX_TRANSLATIONS, or lower the model with "
            "fxloom.lower.lower, which leaves unsupported nodes in PyTorch."
        )
        super().__init__("\n".join(lines), unsupported)


class TranslationContext:
    """What a handler sees while a graph is translated: names, new ONNX nodes, constants, meta.

    ``name(value)`` is the ONNX value of an argument (a tensor node, or a Python number, list or
    tensor made a constant); ``node(op_type, inputs, outputs=1, **attributes)`` appends an ONNX
    node and returns its output name (a tuple when ``outputs > 1``); ``constant(value,
    dtype=None)`` adds an initializer; ``shape_of(node)``/``dtype_of(node)`` read the node's
    ``tensor_meta`` (a size computed in the graph is an int64 scalar); ``module(node)`` is the
    submodule a call_module node calls.
    """

    def __init__(self, module: GraphModule, opset: int) -> None:
        self.module_root = module
        self.opset = opset
        self.onnx_nodes: list[Any] = []
        self.initializers: list[Any] = []
        self.env: dict[Node, Any] = {}  # node -> its ONNX value name (a tuple for a tuple)
        self.folded: dict[Node, Any] = {}  # node -> the Python value the examples fix
        self.current: Node | None = None
        self._tensor_names: dict[tuple, tuple[torch.Tensor, str]] = {}
        self._counter = itertools.count()
        self._constant_names: set[str] = set()

    def fresh(self, hint: str) -> str:
        prefix = self.current.name if self.current is not None else "value"
        return f"{prefix}__{hint}_{next(self._counter)}"

    def name(self, value: Any, dtype: torch.dtype | None = None) -> str:
        if isinstance(value, Node):
            if value in self.folded:
                return self.constant(self.folded[value], dtype=dtype, name=value.name)
            return self.env[value]
        return self.constant(value, dtype=dtype)

    def node(
        self, op_type: str, inputs: list[str], outputs: int = 1, *, domain: str = "", **attrs: Any
    ) -> Any:
        onnx = require("onnx")
        names = [self.fresh(op_type.lower()) for _ in range(outputs)]
        self.onnx_nodes.append(
            onnx.helper.make_node(
                op_type, list(inputs), names, name=names[0], domain=domain or None, **attrs
            )
        )
        return names[0] if outputs == 1 else tuple(names)

    def constant(self, value: Any, dtype: torch.dtype | None = None, name: str = "") -> str:
        """An initializer holding ``value``; a tensor object read twice is stored once."""
        if isinstance(value, torch.Tensor):
            key = (id(value), dtype)
            known = self._tensor_names.get(key)
            if known is not None and known[0] is value:
                return known[1]
            tensor = value.detach()
        else:
            tensor = torch.tensor(value, dtype=dtype or _python_dtype(value))
        if dtype is not None and tensor.dtype != dtype:
            tensor = tensor.to(dtype)
        onnx_name = name if name and name not in self._constant_names else self.fresh("const")
        self._constant_names.add(onnx_name)
        self.initializers.append(_make_initializer(tensor, onnx_name))
        if isinstance(value, torch.Tensor):  # kept alive here, so its id is not reused
            self._tensor_names[key] = (value, onnx_name)
        return onnx_name

    def constant_uint4(self, codes: torch.Tensor) -> str:
        """An ONNX ``UINT4`` initializer (opset 21) of ``codes`` (integers 0..15, any shape),
        packed two per byte, the first of each pair in the low nibble, as ONNX stores them."""
        onnx = require("onnx")
        flat = codes.reshape(-1).to(torch.uint8)
        if flat.numel() % 2:
            flat = torch.cat([flat, flat.new_zeros(1)])
        packed = flat[0::2] | (flat[1::2] << 4)
        name = self.fresh("uint4")
        self._constant_names.add(name)
        self.initializers.append(
            onnx.helper.make_tensor(
                name, onnx.TensorProto.UINT4, list(codes.shape), packed.numpy().tobytes(), raw=True
            )
        )
        return name

    def shape_of(self, node: Node | torch.Tensor) -> tuple[int, ...]:
        if isinstance(node, torch.Tensor):  # a folded argument
            return tuple(node.shape)
        meta = node.meta.get("tensor_meta")
        return tuple(meta.shape) if meta is not None else ()

    def dtype_of(self, node: Node | torch.Tensor) -> torch.dtype:
        if isinstance(node, torch.Tensor):
            return node.dtype
        meta = node.meta.get("tensor_meta")
        return meta.dtype if meta is not None else torch.int64

    def module(self, node: Node) -> torch.nn.Module:
        return self.module_root.get_submodule(str(node.target))


def translate(
    gm: GraphModule | ExportedProgram | torch.nn.Module,
    example_inputs: tuple[Any, ...] | dict[str, Any],
    *,
    dynamic_batch: bool = False,
    dynamic_shapes: Any = None,
    opset: int = 18,
) -> Any:
    """Translate ``gm`` (a GraphModule, an ExportedProgram, or a module traced here on the
    examples) into an ``onnx.ModelProto``.

    ``dynamic_shapes`` (``fxloom.export``'s form: ``{"input_ids": {0: batch, 1: seq}}``)
    leaves those dimensions free, in the inputs, the outputs and every size computed from
    them; ``dynamic_batch=True`` is short for dimension 0 of every tensor input (see
    ``fxloom.lower.dynamic_dims``).

    >>> import torch, fxloom
    >>> from fxloom.lower import translate
    >>> def scores(x, y):
    ...     return torch.softmax(x @ y.transpose(0, 1) + 1, dim=-1)
    >>> x, y = torch.ones(2, 4), torch.ones(3, 4)
    >>> proto = translate(fxloom.symbolic_trace(scores, example_inputs=(x, y)), (x, y))
    >>> [node.op_type for node in proto.graph.node]
    ['Transpose', 'MatMul', 'Add', 'Softmax', 'Identity']
    """
    gm = program_to_read(gm, example_inputs, consumer="fxloom.lower.translate")
    runs = runs_for(gm, example_inputs, dynamic_batch, dynamic_shapes)
    return translate_at_sizes(gm, example_inputs, runs, opset=opset)


def translate_at_sizes(
    gm: GraphModule | ExportedProgram,
    example_inputs: tuple[Any, ...] | dict[str, Any],
    runs: list[SizeRun],
    *,
    opset: int = 18,
) -> Any:
    """``translate`` with the dynamic dimensions given as runs at other sizes (``SizeRun``)."""
    onnx = require("onnx")
    module = graph_module_of(gm)
    folded, sizes = _record_values(gm, example_inputs, runs)
    unsupported = _unsupported_nodes(module, folded)
    if unsupported:
        raise UnsupportedNodeError(unsupported)
    opset = max([opset, *_opsets_needed(module, folded)])
    ctx = TranslationContext(module, opset)
    lifted = lifted_state(gm)
    graph_inputs, outputs = [], []
    for node in module.graph.nodes:
        ctx.current = node
        if node.op == "placeholder" and node.name in lifted:
            ctx.folded[node] = lifted[node.name].tensor  # an initializer once a node reads it
        elif node in folded:
            ctx.folded[node] = folded[node]
        elif node.op == "placeholder":
            graph_inputs.append(_input_value_info(onnx, node, sizes))
            ctx.env[node] = graph_inputs[-1].name
        elif node.op == "output":
            outputs = _emit_outputs(onnx, ctx, node, sizes)
        elif node.op == "call_function" and stays_on_host(node.target):
            continue
        else:
            ctx.env[node] = _translate_call(ctx, node)
    graph = onnx.helper.make_graph(
        ctx.onnx_nodes, type(module).__name__, graph_inputs, outputs, ctx.initializers
    )
    model = onnx.helper.make_model(
        graph, opset_imports=[onnx.helper.make_opsetid("", opset)], producer_name="fxloom"
    )
    model.ir_version = min(model.ir_version, 10)  # what current ONNX Runtime releases read
    return model


def unsupported_reason(node: Node, gm: GraphModule | ExportedProgram) -> str | None:
    """Why ``node`` cannot be translated to ONNX, or ``None`` if it can.

    Reads the node's ``tensor_meta`` when present (run ``ShapeProp`` first for dtype checks).

    >>> import torch, fxloom
    >>> from fxloom.lower import unsupported_reason
    >>> gm = fxloom.symbolic_trace(lambda x: torch.sort(x).values.relu())
    >>> [unsupported_reason(n, gm) for n in gm.graph.nodes if n.op == "call_function"][0]
    'no ONNX translation for torch.sort (add one to fxloom.lower.ONNX_TRANSLATIONS)'
    """
    if node.op in ("placeholder", "output", "get_attr"):
        return None
    if node.op == "call_function" and stays_on_host(node.target):
        return None
    if _always_folded(node):
        return None
    module = graph_module_of(gm)
    called = module.get_submodule(str(node.target)) if node.op == "call_module" else None
    handler = handler_for(node.op, node.target, called)
    if handler is None:
        return f"no ONNX translation for {describe_target(node)} (add one to fxloom.lower.ONNX_TRANSLATIONS)"
    for meta in tensor_metas(node.meta.get("tensor_meta")):
        if not has_onnx_dtype(meta.dtype):
            return f"its result is a {meta.dtype} tensor, which ONNX has no element type for"
    refuses = getattr(handler, "refuses", None)
    return refuses(node, module) if refuses is not None else None


def to_onnx(
    model_or_gm: torch.nn.Module | GraphModule | ExportedProgram,
    example_inputs: tuple[Any, ...] | dict[str, Any],
    path: str | os.PathLike,
    *,
    dynamic_batch: bool = False,
    dynamic_shapes: Any = None,
) -> Any:
    """Write ``model_or_gm`` as one checked ONNX file at ``path``; return the ``ModelProto``.

    A plain module is traced first (``fxloom.symbolic_trace`` with the examples); a graph with
    any node ONNX cannot take raises ``UnsupportedNodeError`` listing each one and writes nothing.
    ``dynamic_shapes`` (``{"input_ids": {0: Dim("batch"), 1: Dim("seq")}}``, as
    ``fxloom.export`` takes it) makes those dimensions symbolic in the file's inputs and
    outputs, named after their Dims; ``dynamic_batch=True`` is short for dimension 0 of every
    tensor input, named ``batch``.

    A causal language model of transformers with its cache on (``fxloom.lower.decoder``) is
    written as two files in the directory ``path``: ``prefill.onnx`` and ``decode.onnx``, the
    key/value cache as named inputs and outputs and every size dynamic; the decode graph's
    ``ModelProto`` is returned.

    >>> import tempfile, os, torch
    >>> from fxloom.lower import to_onnx
    >>> path = os.path.join(tempfile.mkdtemp(), "head.onnx")
    >>> head = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.LogSoftmax(dim=1))
    >>> proto = to_onnx(head, (torch.ones(3, 2, 4),), path, dynamic_batch=True)
    >>> import onnxruntime
    >>> session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    >>> session.run(None, {"input": torch.ones(5, 2, 4).numpy()})[0].shape
    (5, 8)
    """
    onnx = require("onnx")
    from fxloom.lower.decoder import decoder_to_onnx, is_causal_lm

    if is_causal_lm(model_or_gm) and not (dynamic_batch or dynamic_shapes):
        paths = decoder_to_onnx(model_or_gm, path, example_inputs)  # its sizes are all dynamic
        return onnx.load(os.fspath(paths["decode"]))
    gm = program_to_read(model_or_gm, example_inputs, consumer="fxloom.lower.to_onnx")
    proto = translate(
        gm, example_inputs, dynamic_batch=dynamic_batch, dynamic_shapes=dynamic_shapes
    )
    onnx.checker.check_model(proto, full_check=True)
    onnx.save_model(proto, os.fspath(path))
    return proto


# ---- steps ---------------------------------------------------------------------------------


class _ValueRecorder(ShapeProp):
    """``ShapeProp`` that also sorts nodes into translated ones and folded ones, with values.

    A node is translated when it is a tensor input, when it holds a tensor computed from a
    translated node, or when its value differs from the one a run at other sizes gave
    (``others``: those runs' values; dynamic dimensions); every other node is folded, its
    value kept.
    """

    def __init__(self, gm: Any, lifted: set[str], others: list[dict[Node, Any]]) -> None:
        super().__init__(gm)
        self.lifted = lifted
        self.others = others
        self.translated: set[Node] = set()
        self.values: dict[Node, Any] = {}

    def run_node(self, n: Node) -> Any:
        value = super().run_node(n)
        if n.op == "output" or (n.op == "call_function" and stays_on_host(n.target)):
            return value
        if n.op == "placeholder":
            computed = n.name not in self.lifted and _holds_tensor_value(value)
        else:
            depends = any(arg in self.translated for arg in n.all_input_nodes)
            computed = (depends and _holds_tensor_value(value)) or self._varies(n, value)
        if computed:
            self.translated.add(n)
        elif n.op != "placeholder" or n.name not in self.lifted:
            self.values[n] = value
        return value

    def _varies(self, n: Node, value: Any) -> bool:
        if _holds_tensor_value(value):
            return False
        return any(n not in other or not _same(value, other[n]) for other in self.others)


class _Sizes:
    """The shapes every node had in each run at other sizes; names the dims that changed."""

    def __init__(self, runs: list[SizeRun], metas: list[dict[Node, Any]]) -> None:
        self.runs = runs
        self.metas = metas  # per run: node -> its tensor_meta there

    def shape(self, node: Node, position: int, meta: TensorMetadata, fresh: str) -> list[Any]:
        """``meta``'s shape (the ``position``-th tensor of ``node``), dynamic dims named."""
        others = []
        for metas in self.metas:
            there = tensor_metas(metas.get(node))
            others.append(tuple(there[position].shape) if position < len(there) else None)
        return dim_names(tuple(meta.shape), others, self.runs, fresh)


def _record_values(
    gm: Any, example_inputs: Any, runs: list[SizeRun]
) -> tuple[dict[Node, Any], _Sizes]:
    """Run ``gm`` on the examples: the folded values, and every node's shapes in the runs.

    Each run at other sizes comes first and finds the values that change with them (they are
    not folded); the examples run last, so ``tensor_meta`` is theirs.
    """
    module = graph_module_of(gm)
    lifted = set(lifted_state(gm))
    others, metas = [], []
    for run in runs:
        try:
            others.append(_run(gm, lifted, [], run.inputs))
        except Exception as error:
            raise ValueError(run_failed(run, error, "the graph")) from error
        metas.append({n: n.meta.get("tensor_meta") for n in module.graph.nodes})
    values = _run(gm, lifted, others, example_inputs)
    return values, _Sizes(runs, metas)


def _run(gm: Any, lifted: set[str], others: list[dict[Node, Any]], example_inputs: Any) -> dict:
    recorder = _ValueRecorder(gm, lifted, others)
    if isinstance(example_inputs, dict):
        recorder.propagate(**example_inputs)
    else:
        recorder.propagate(*example_inputs)
    return recorder.values


# Values that never change with the batch size: translate folds them, whatever computes them.
_FIXED_VALUE_TYPES = (bool, float, str, torch.dtype, torch.device, type(None))


def _always_folded(node: Node) -> bool:
    """Whether ``node``'s value (recorded by ShapeProp) is a flag, dtype or device: folded."""
    value_type = node.meta.get("type")
    return value_type is not None and issubclass(value_type, _FIXED_VALUE_TYPES)


def tensor_metas(meta: Any) -> list[TensorMetadata]:
    """The ``TensorMetadata`` in a node's ``tensor_meta`` (one, or a nesting of them)."""
    leaves = tree_leaves(meta, is_leaf=lambda v: isinstance(v, TensorMetadata))
    return [leaf for leaf in leaves if isinstance(leaf, TensorMetadata)]


def _holds_tensor_value(value: Any) -> bool:
    return any(isinstance(leaf, torch.Tensor) for leaf in tree_leaves(value))


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.shape == b.shape
            and a.dtype == b.dtype
            and bool(torch.equal(a, b))
        )
    try:
        return bool(a == b) and type(a) is type(b)
    except Exception:  # values that cannot be compared: assume they differ
        return False


def _unsupported_nodes(module: GraphModule, folded: dict[Node, Any]) -> list[tuple[Node, str]]:
    found = []
    for node in module.graph.nodes:
        if node in folded:
            continue
        reason = unsupported_reason(node, module)
        if reason is not None:
            found.append((node, reason))
    return found


def _opsets_needed(module: GraphModule, folded: dict[Node, Any]) -> list[int]:
    """The opsets the handlers of the translated nodes need (a handler's ``opset``: the
    quantized operators write opset 21's blocked ``DequantizeLinear``)."""
    needed = []
    for node in module.graph.nodes:
        if node.op in ("call_function", "call_method", "call_module") and node not in folded:
            called = module.get_submodule(str(node.target)) if node.op == "call_module" else None
            needed.append(getattr(handler_for(node.op, node.target, called), "opset", 0))
    return needed


def _translate_call(ctx: TranslationContext, node: Node) -> Any:
    called = ctx.module(node) if node.op == "call_module" else None
    handler = handler_for(node.op, node.target, called)
    args = map_arg(node.args, lambda n: _argument_value(ctx, n))
    kwargs = map_arg(node.kwargs, lambda n: _argument_value(ctx, n))
    try:
        return handler(ctx, node, tuple(args), dict(kwargs))
    except UnsupportedArgument as refusal:
        raise UnsupportedNodeError([(node, str(refusal))]) from None


def _argument_value(ctx: TranslationContext, node: Node) -> Any:
    """A folded argument as its Python value; a translated one stays a node."""
    return ctx.folded[node] if node in ctx.folded else node


def _input_value_info(onnx: Any, node: Node, sizes: _Sizes) -> Any:
    meta = node.meta.get("tensor_meta")
    name = str(node.target).lstrip("*")
    shape = sizes.shape(node, 0, meta, name)
    return onnx.helper.make_tensor_value_info(name, onnx_dtype(meta.dtype), shape)


def _emit_outputs(onnx: Any, ctx: TranslationContext, node: Node, sizes: _Sizes) -> list[Any]:
    """``output_0``, ``output_1`` ...: the output's tensors, flattened, in order."""
    outputs = []
    for leaf in tree_leaves(node.args[0]):
        if isinstance(leaf, Node) and leaf in ctx.env and leaf.meta.get("type") in _NUMBERS:
            outputs.append(_number_output(onnx, ctx, leaf, f"output_{len(outputs)}"))
            continue
        if not isinstance(leaf, Node) or leaf.meta.get("tensor_meta") is None:
            continue
        # One tensor, or the items of a multi-output node or container (nested ones too).
        names, metas = _flat_names(ctx.name(leaf)), tensor_metas(leaf.meta["tensor_meta"])
        for position, (name, meta) in enumerate(zip(names, metas)):
            output = f"output_{len(outputs)}"
            ctx.onnx_nodes.append(onnx.helper.make_node("Identity", [name], [output]))
            shape = sizes.shape(leaf, position, meta, output)
            outputs.append(
                onnx.helper.make_tensor_value_info(output, onnx_dtype(meta.dtype), shape)
            )
    return outputs


_NUMBERS = (int, float, bool)


def _number_output(onnx: Any, ctx: TranslationContext, leaf: Node, output: str) -> Any:
    """A number the graph computes (a size that changes with the dynamic dimensions): a 0-d
    output, returned to PyTorch as a Python number (``OrtModule``'s ``scalar_outputs``)."""
    ctx.onnx_nodes.append(onnx.helper.make_node("Identity", [ctx.env[leaf]], [output]))
    dtype = _python_dtype(leaf.meta["type"]())
    return onnx.helper.make_tensor_value_info(output, onnx_dtype(dtype), [])


def _flat_names(names: Any) -> list[str]:
    if isinstance(names, str):
        return [names]
    return [name for item in names for name in _flat_names(item)]


def _make_initializer(tensor: torch.Tensor, name: str) -> Any:
    from onnx import numpy_helper

    if tensor.dtype == torch.bfloat16:
        raise UnsupportedArgument("bfloat16 constants are not supported by this translator")
    return numpy_helper.from_array(tensor.cpu().contiguous().numpy(), name)


def _python_dtype(value: Any) -> torch.dtype:
    leaves = tree_leaves(value) if isinstance(value, (list, tuple)) else [value]
    if any(isinstance(v, float) for v in leaves):
        return torch.float32
    if leaves and all(isinstance(v, bool) for v in leaves):
        return torch.bool
    return torch.int64


def _source_line(node: Node) -> str:
    """``File "model.py", line 12, in forward: return torch.relu(x)``; empty where unknown."""
    location = source_location(node)
    if location is None:
        return ""
    where, *code = (line.strip() for line in location.frame_text().splitlines())
    return f"{where}: {code[0]}" if code else where
