"""``fxloom.save(gm, path)`` and ``fxloom.load(path)``: GraphModules in a file you can trust.

Loading never unpickles and never runs code from the file: functions and
module classes are looked up by name on an allowlist (see ``allowlist``),
tensors come from safetensors, and the module's ``forward`` is generated
again from the graph. Any problem raises ``SerializationError``; the caller
never receives a partly built module.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from fxloom._version import __version__
from fxloom.graph_module import GraphModule
from fxloom.lint import lint_graph
from fxloom.serialize.archive import PathOrFile, described_kind, read_archive, write_archive
from fxloom.serialize.devices import MapLocation, Placement, move_graph_devices
from fxloom.serialize.errors import SerializationError
from fxloom.serialize.frozen_tree import check_get_attr_uses
from fxloom.serialize.generated_code import check_generated_forward
from fxloom.serialize.meta import MetaCodecs
from fxloom.serialize.module_members import MISSING, ParametrizedTensor, held_at
from fxloom.serialize.module_shapes import check_module_shapes
from fxloom.serialize.modules import decode_module, encode_module
from fxloom.serialize.tensors import TensorReader, TensorWriter

__all__ = ["save", "load", "guarded_load", "check_loaded"]

KIND = "graph_module"


def save(gm: GraphModule, f: PathOrFile) -> None:
    """Write ``gm`` — its graph, submodules, parameters, buffers and node meta — to ``f``.

    ``f`` is a path or a binary file. Everything the graph calls must be on
    the allowlist (torch, ``operator``, ``math``, Tensor methods, ``torch.ops``
    operators, a few builtins) or registered with ``fxloom.register_serializable``;
    otherwise ``SerializationError`` names it and nothing is written::

        import torch, fxloom
        gm = fxloom.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU()))
        fxloom.save(gm, "/tmp/model.fxl")
        loaded = fxloom.load("/tmp/model.fxl")
        x = torch.randn(4, 3)
        assert torch.equal(loaded(x), gm(x))
    """
    if not isinstance(gm, GraphModule):
        raise TypeError(
            f"fxloom.save takes a GraphModule, got {type(gm).__name__}; capture it first "
            "(fxloom.symbolic_trace), or use fxloom.export.save for an ExportedProgram"
        )
    writer = TensorWriter()
    program = {"module": encode_module(gm, writer, MetaCodecs(), "the module")}
    write_archive(f, KIND, program, writer.tensors, _versions())


def load(f: PathOrFile | bytes, map_location: MapLocation = None) -> GraphModule:
    """The GraphModule saved in ``f`` (a path, a binary file or the file's bytes).

    Tensors go back to the devices they were saved on, or where ``map_location``
    says: a device or string (``"cpu"``), a dict ``{saved: new}``, or a callable
    ``(tensor, saved_device) -> tensor or device`` — as ``torch.load`` takes it;
    ``fxloom.serialize.devices`` says exactly what each form does. A saved device
    this machine lacks (CUDA without a GPU) is refused, naming the tensor;
    ``map_location="cpu"`` loads such a file here.

    Raises ``SerializationError`` (and only that, or ``FileNotFoundError``) if
    the file is damaged, of another kind or version, names anything not on
    the allowlist, or puts a tensor on a device this machine does not have.
    """
    placement = Placement(map_location)  # a wrong kind of map_location is the caller's error
    archive = guarded_load(f, read_archive)
    if archive.kind != KIND:
        hint = " (load it with fxloom.export.load)" if archive.kind == "exported_program" else ""
        raise SerializationError(
            f"the file holds {described_kind(archive.kind)}, not a GraphModule{hint}"
        )

    def build(archive: Any) -> GraphModule:
        program = archive.program
        if not isinstance(program, dict):
            raise SerializationError("program.json must be an object")
        reader = TensorReader(archive.weights, placement)
        module = decode_module(program.get("module"), reader, MetaCodecs(), "module")
        if not isinstance(module, GraphModule):
            raise SerializationError(
                f"the file's root module is a {type(module).__name__}, not a GraphModule"
            )
        check_loaded(module)
        move_graph_devices(module, placement)
        return module

    return guarded_load(archive, build)


def guarded_load(source: Any, step: Any) -> Any:
    """``step(source)``, with every failure but a missing file turned into ``SerializationError``.

    The tensors it makes are ordinary ones even inside ``torch.inference_mode()``: inference
    tensors have no version counter, and the quantized kernels key their packed weights on
    it (running the loaded module inside the mode is fine).
    """
    try:
        with torch.inference_mode(False):
            return step(source)
    except (SerializationError, FileNotFoundError):
        raise
    except RecursionError:
        raise SerializationError("the file is nested too deeply to load; refused") from None
    except Exception as e:
        raise SerializationError(f"cannot load the file: {type(e).__name__}: {e}") from e


def check_loaded(gm: GraphModule) -> None:
    """The loaded module must be whole: a valid graph whose attributes exist and agree with it.

    Every check reads the modules' dictionaries (``_modules``, ``_parameters``, ``_buffers``,
    ``vars``), never an attribute through ``getattr``: a property or parametrization would run
    code the file chose. Its ``forward`` is generated at the first call, as for any
    GraphModule (an unpickled one too): every name that goes into the code was checked while
    decoding (``graphs``), and arguments nest at most ``graphs.MAX_ARGUMENT_DEPTH`` deep, so
    generating it cannot be steered or exhausted by the file.
    """
    for path, module in gm.named_modules():
        where = f"module {path}" if path else "the root module"
        check_module_shapes(module, where)
        if isinstance(module, GraphModule):
            try:
                lint_graph(module.graph, None)  # its structure; targets are checked below
            except RecursionError:
                raise SerializationError("the loaded graph is nested too deeply; refused") from None
            except Exception as e:
                raise SerializationError(f"the loaded graph is not valid: {e}") from None
            _check_targets(module, where)
            check_generated_forward(module, where)


def _check_targets(gm: GraphModule, where: str) -> None:
    """Each ``get_attr``/``call_module`` target is held by the module, and a tensor it reads
    has the shape and dtype the graph says."""
    for op in ("get_attr", "call_module"):
        for node in gm.graph.find_nodes(op=op):
            value = held_at(gm, node.target)
            if value is MISSING or (op == "call_module" and not isinstance(value, nn.Module)):
                kind = "a module" if op == "call_module" else "anything"
                raise SerializationError(
                    f"{where}: %{node.name} ({op}) targets {node.target!r}, which does not hold "
                    f"{kind}; refused"
                )
            if op == "get_attr":
                _check_tensor_meta(node, value)
                check_get_attr_uses(node, value, where)


def _check_tensor_meta(node: Any, value: Any) -> None:
    expected = node.meta.get("val", node.meta.get("tensor_meta"))
    if isinstance(value, torch.Tensor):
        shape, dtype = tuple(value.shape), value.dtype
    elif isinstance(value, ParametrizedTensor):
        shape, dtype = value.shape, getattr(expected, "dtype", None)
    else:
        return
    if expected is None or not hasattr(expected, "shape"):
        return
    if shape != tuple(expected.shape) or dtype != expected.dtype:
        raise SerializationError(
            f"the tensor {node.target} is {dtype} {list(shape)}, but the graph "
            f"(node %{node.name}) expects {expected.dtype} {list(expected.shape)}"
        )


def _versions() -> dict[str, str]:
    return {
        "fxloom_version": __version__,
        "torch_version": torch.__version__,
    }
