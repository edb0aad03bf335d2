"""How an ``OrtModule`` is saved in an fxloom file and loaded back, and what loading refuses.

The ONNX Runtime backend's ``SavedModule`` rule (``fxloom.backends``); ``fxloom.save``
and ``fxloom.load`` ask the backend registry for it. A region is written as its ONNX model,
which is data (a protobuf), in a uint8 tensor, with its calling convention (the structure
of its outputs, the positions of scalar, constant, laid-out outputs and fixed inputs).
Loading checks all of them and makes the module again without starting a session, which it
starts on its first call.

An ONNX model is data, but two of its features reach outside it: a tensor may keep its
values in an external file (``data_location: EXTERNAL`` / ``external_data``, a path
ONNX Runtime opens relative to the working directory), and a node may name an operator
domain that only a custom-op library provides. A region from a file may use neither:
``check_onnx_model`` parses the model with the ``onnx`` package and walks every graph in
it (the main graph, subgraphs of control-flow nodes, local functions) with a work-list,
refusing both. Without ``onnx`` installed nothing can be checked, so the file is refused;
saving runs the same check, so no file is written that loading would refuse.

Session options (threads, optimization level, spinning) are the machine's business, never
the file's: a loaded region runs with ``OrtModule``'s defaults (intra-op threads: torch's
thread count). Files written before this rule still hold them: checked for type, then not
used.

Depends on: ``fxloom.lower.runtime``, ``fxloom.backends`` (the rule's types); ``onnx``
(imported when a region is saved or loaded).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from fxloom.backends import SavedModule, SavedStateError, StateReader, StateWriter
from fxloom.lower.runtime import OrtModule

__all__ = ["ONNX_DOMAINS", "ORT_MODULE_SAVING", "check_onnx_model"]

# Operator domains fxloom's lowering writes, all built into ONNX Runtime ("" is ai.onnx).
ONNX_DOMAINS = frozenset({"", "ai.onnx"})

# What a file says of a region: OrtModule's keyword arguments that describe the model's
# calling convention, each with the type its value must have.
_ORT_SETTINGS: dict[str, tuple[type, ...]] = {
    "name": (str,),
    "scalar_outputs": (tuple,),
    "constant_outputs": (dict,),
    "output_layouts": (dict,),
    "fixed_inputs": (dict,),
}
# Session options files written before they were left out still hold: checked, not used.
_CORES = os.cpu_count() or 1
_ORT_SESSION_OPTIONS: dict[str, tuple[type, ...]] = {
    "intra_op_num_threads": (int, type(None)),
    "inter_op_num_threads": (int,),
    "graph_optimization_level": (str,),
    "allow_spinning": (bool,),
}


# ------------------------------------------------------------------ saving and loading
def save_ort_module(module: nn.Module, writer: StateWriter, where: str) -> dict[str, Any]:
    """The region's record: its ONNX model as a uint8 tensor, its output structure and
    calling convention (what loading would refuse is not written)."""
    model = bytes(module.model_bytes)
    check_onnx_model(model, where)
    settings = {name: vars(module)[name] for name in _ORT_SETTINGS}
    _check_settings(settings, module.output_spec.num_leaves, where, lambda n: repr(settings[n]))
    data = (
        torch.frombuffer(bytearray(model), dtype=torch.uint8)
        if model
        else torch.empty(0, dtype=torch.uint8)
    )
    return {
        "onnx_model": writer.tensor(data, f"{where}.model_bytes"),
        "output_spec": writer.spec(module.output_spec),
        "settings": {
            name: writer.value(value, f"{where}.{name}") for name, value in settings.items()
        },
    }


def load_ort_module(data: Any, reader: StateReader, where: str) -> OrtModule:
    """The region ``save_ort_module`` wrote, every part checked; its session starts on its
    first call, with fxloom's session options."""
    record = reader.field(data, "onnx_model", dict, where)
    model = reader.tensor(record, f"{where}.model_bytes", data_on_cpu=True)
    if model.dtype != torch.uint8 or model.dim() != 1:
        raise SavedStateError(f"{where}: the ONNX model must be a 1-d uint8 tensor")
    model_bytes = model.numpy().tobytes()
    check_onnx_model(model_bytes, where)
    spec = reader.spec(data.get("output_spec"), f"{where}.output_spec")
    saved = reader.field(data, "settings", dict, where)
    for name in saved:
        if name not in _ORT_SETTINGS and name not in _ORT_SESSION_OPTIONS:
            raise SavedStateError(f"{where}: OrtModule has no setting {name!r}")
    settings = {name: reader.value(value, f"{where}.{name}") for name, value in saved.items()}
    _check_settings(settings, spec.num_leaves, where, lambda name: reader.describe(saved[name]))
    try:  # the session is made on the first call, not here
        return OrtModule(
            model_bytes,
            output_spec=spec,
            **{name: value for name, value in settings.items() if name in _ORT_SETTINGS},
        )
    except ValueError as e:
        raise SavedStateError(f"{where}: {e}") from None


def _check_settings(
    settings: dict[str, Any], outputs: int, where: str, shown: Callable[[str], str]
) -> None:
    """Refuse a setting of the wrong type, more threads than cores, or positions out of range
    among the region's ``outputs`` results; ``shown(name)`` is the value as the file has it."""
    for name, value in settings.items():
        if not isinstance(value, _ORT_SETTINGS.get(name) or _ORT_SESSION_OPTIONS[name]):
            raise SavedStateError(f"{where}: {name} cannot be {shown(name)}")
        if name.endswith("_threads") and value is not None and not 0 <= value <= _CORES:
            # Never used, but no file fxloom wrote asked for more threads than cores.
            raise SavedStateError(
                f"{where}: {name}={value} is more threads than this machine's {_CORES} cores"
            )
    positions = [
        *settings.get("scalar_outputs", ()),
        *settings.get("constant_outputs", {}),
        *settings.get("output_layouts", {}),
    ]
    if not all(type(p) is int and 0 <= p < outputs for p in positions):
        raise SavedStateError(
            f"{where}: scalar, constant and laid-out outputs must be positions among its "
            f"{outputs} outputs"
        )
    if not all(type(p) is int and p >= 0 for p in settings.get("fixed_inputs", {})):
        raise SavedStateError(f"{where}: fixed inputs must be argument positions")


ORT_MODULE_SAVING = SavedModule(save_ort_module, load_ort_module)


# ------------------------------------------------------------ what a model may not ask
def check_onnx_model(model_bytes: bytes, where: str) -> None:
    """Refuse a model that is not valid ONNX, or reads external data or custom operators."""
    onnx = _onnx(where)
    try:
        model = onnx.ModelProto.FromString(model_bytes)
    except Exception as e:  # protobuf's DecodeError, or its recursion limit
        raise SavedStateError(f"{where}: the ONNX model cannot be parsed: {e}") from None
    for opset in model.opset_import:
        _check_domain(opset.domain, f"{where}: the ONNX model imports the opset", where)
    for graph_where, tensors, nodes in _graphs(model):
        for name, tensor in tensors:
            if tensor.data_location == onnx.TensorProto.EXTERNAL or len(tensor.external_data):
                raise SavedStateError(
                    f"{where}: the ONNX tensor {name!r} ({graph_where}) keeps its values in an "
                    "external file; a region in an fxloom file holds all of its data"
                )
        for node in nodes:
            _check_domain(node.domain, f"{where}: the ONNX node {node.name!r} uses", where)


def _onnx(where: str) -> Any:
    try:
        return importlib.import_module("onnx")
    except ImportError:
        raise SavedStateError(
            f"{where}: the file holds an ONNX Runtime region, whose ONNX model must be checked "
            "before it is loaded, and that needs the onnx package: pip install 'fxloom[onnx]'"
        ) from None


def _check_domain(domain: str, what: str, where: str) -> None:
    if domain not in ONNX_DOMAINS:
        raise SavedStateError(
            f"{what} the operator domain {domain!r}, which only a custom-op library "
            f"provides; regions may use {sorted(ONNX_DOMAINS)} only"
        )


def _graphs(model: Any) -> Iterator[tuple[str, list[tuple[str, Any]], list[Any]]]:
    """Each graph and function in ``model``: (its name, its named tensors, its nodes)."""
    work: list[tuple[str, Any]] = [("the main graph", model.graph)]
    for function in model.functions:
        yield (
            f"function {function.name!r}",
            _attribute_tensors(function.attribute_proto),
            list(function.node),
        )
        work += _subgraphs(function.node, f"function {function.name!r}")
    while work:
        name, graph = work.pop()
        tensors = [(t.name, t) for t in graph.initializer]
        for sparse in graph.sparse_initializer:
            tensors += [(sparse.values.name, sparse.values), (sparse.indices.name, sparse.indices)]
        for node in graph.node:
            tensors += _attribute_tensors(node.attribute)
        yield name, tensors, list(graph.node)
        work += _subgraphs(graph.node, name)


def _attribute_tensors(attributes: Any) -> list[tuple[str, Any]]:
    """The tensors node attributes hold (``value`` of Constant, ...), sparse ones' parts too."""
    found = []
    for attribute in attributes:
        tensors = [*([attribute.t] if attribute.HasField("t") else []), *attribute.tensors]
        sparse_tensors = [attribute.sparse_tensor] if attribute.HasField("sparse_tensor") else []
        for sparse in [*sparse_tensors, *attribute.sparse_tensors]:
            tensors += [sparse.values, sparse.indices]
        found += [(t.name or attribute.name, t) for t in tensors]
    return found


def _subgraphs(nodes: Any, where: str) -> list[tuple[str, Any]]:
    """The graphs held by ``nodes``' attributes (the branches of If, the body of Loop...)."""
    return [
        (f"{where}, node {node.name!r}.{attribute.name}", graph)
        for node in nodes
        for attribute in node.attribute
        for graph in [*([attribute.g] if attribute.HasField("g") else []), *attribute.graphs]
    ]
