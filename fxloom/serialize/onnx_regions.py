"""The ONNX model of an ONNX Runtime region in a file: what it may not ask of ONNX Runtime.

An ONNX model is data, but two of its features reach outside it: a tensor may keep its
values in an external file (``data_location: EXTERNAL`` / ``external_data``, a path
ONNX Runtime opens relative to the working directory), and a node may name an operator
domain that only a custom-op library provides. A region from a file may use neither:
``check_onnx_model`` parses the model with the ``onnx`` package and walks every graph in
it (the main graph, subgraphs of control-flow nodes, local functions) with a work-list,
refusing both. Without ``onnx`` installed nothing can be checked, so the file is refused.

Session options (threads, optimization level, spinning) are not read from a file at all:
see ``module_states``.

Depends on: ``onnx`` (imported when a region is loaded).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Any

from fxloom.serialize.errors import SerializationError

__all__ = ["ONNX_DOMAINS", "check_onnx_model"]

# Operator domains fxloom's lowering writes, all built into ONNX Runtime ("" is ai.onnx).
ONNX_DOMAINS = frozenset({"", "ai.onnx"})


def check_onnx_model(model_bytes: bytes, where: str) -> None:
    """Refuse a model that is not valid ONNX, or reads external data or custom operators."""
    onnx = _onnx(where)
    try:
        model = onnx.ModelProto.FromString(model_bytes)
    except Exception as e:  # protobuf's DecodeError, or its recursion limit
        raise SerializationError(f"{where}: the ONNX model cannot be parsed: {e}") from None
    for opset in model.opset_import:
        _check_domain(opset.domain, f"{where}: the ONNX model imports the opset", where)
    for graph_where, tensors, nodes in _graphs(model):
        for name, tensor in tensors:
            if tensor.data_location == onnx.TensorProto.EXTERNAL or len(tensor.external_data):
                raise SerializationError(
                    f"{where}: the ONNX tensor {name!r} ({graph_where}) keeps its values in an "
                    "external file; a region in an fxloom file holds all of its data"
                )
        for node in nodes:
            _check_domain(node.domain, f"{where}: the ONNX node {node.name!r} uses", where)


def _onnx(where: str) -> Any:
    try:
        return importlib.import_module("onnx")
    except ImportError:
        raise SerializationError(
            f"{where}: the file holds an ONNX Runtime region, whose ONNX model must be checked "
            "before it is loaded, and that needs the onnx package: pip install 'fxloom[onnx]'"
        ) from None


def _check_domain(domain: str, what: str, where: str) -> None:
    if domain not in ONNX_DOMAINS:
        raise SerializationError(
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
