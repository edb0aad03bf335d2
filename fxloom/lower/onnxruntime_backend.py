"""The ``"onnxruntime"`` backend: regions translated to ONNX, each run by an ``OrtModule``.

``fxloom.lower``'s default backend (``fxloom.backends`` says what a backend answers).
What it supports is what the translator can translate (``onnx_translate.unsupported_reason``);
a region is compiled by translating it on the inputs lowering recorded (and at the other
sizes ``dynamic_shapes`` asked for, so its dynamic dimensions are symbolic), checking the
model with ``onnx.checker``, starting its session and running it once, whose results must
have the dtypes and shapes PyTorch's had. A region that does no arithmetic stays in PyTorch,
where it is free or one copy, while a call into ONNX Runtime costs microseconds and a copy of
its outputs. A session computes into memory of its own: writes into what the caller holds (an
input, a parameter, a view of one) stay in PyTorch (``fxloom.lower.held_storage``). Sessions
cannot run backward (``trainable`` is False). An ``OrtModule`` is saved
as its ONNX model (``fxloom.lower.runtime_saving``).

Depends on: ``fxloom.lower.onnx_translate``, ``fxloom.lower.runtime``,
``fxloom.lower.runtime_saving``, ``fxloom.passes.cost``; onnx and onnxruntime, imported when
a region is compiled.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import torch

from fxloom.backends import Backend, RegionExamples
from fxloom.graph_module import GraphModule
from fxloom.lower.dynamic_dims import SizeRun, same_number
from fxloom.lower.extra import require
from fxloom.lower.held_storage import held_storage_reasons
from fxloom.lower.lowering import LoweringError
from fxloom.lower.onnx_translate import unsupported_reason
from fxloom.lower.runtime import OrtModule
from fxloom.lower.runtime_saving import ORT_MODULE_SAVING
from fxloom.node import Node
from fxloom.passes.captured import graph_module_of
from fxloom.pytree import tree_flatten

__all__ = ["OnnxRuntimeBackend"]

_CALLS = ("call_function", "call_method", "call_module")


class OnnxRuntimeBackend(Backend):
    """Run regions in ONNX Runtime's CPU provider (see the module docstring)."""

    name = "onnxruntime"
    trainable = False
    saved_modules = MappingProxyType({OrtModule: ORT_MODULE_SAVING})

    def __init__(self, *, threads: int | None = None, spinning: bool | None = None) -> None:
        """``threads``, ``spinning``: the sessions' settings where ``lower`` is given none (as
        ``lower``'s own arguments; None decides by where the work runs). For a caller that
        cannot pass them to ``lower``: ``fxloom.compile(model,
        backend=OnnxRuntimeBackend(threads=1))``."""
        self.threads = threads
        self.spinning = spinning

    def unsupported_reason(self, node: Node, gm: GraphModule) -> str | None:
        reason = unsupported_reason(node, gm)
        if reason is None and node.op in _CALLS:  # it computes into memory of its own
            reason = held_storage_reasons(graph_module_of(gm)).get(node)
        return reason

    def require(self) -> None:
        require("onnx")
        require("onnxruntime")

    def compile(self, region: GraphModule, example_inputs: tuple[Any, ...]) -> OrtModule:
        """The region as one ONNX Runtime session, at the sizes of ``example_inputs``."""
        self.require()
        with torch.no_grad():
            outputs = region(*example_inputs)
        name = type(region).__name__
        return self.compile_region(region, RegionExamples(name, tuple(example_inputs), outputs))

    def compile_region(self, region: GraphModule, examples: RegionExamples) -> OrtModule:
        """Translate, check, start and try one region; raise if any step fails."""
        import onnx

        from fxloom.lower.onnx_translate import translate_at_sizes

        args, expected, name = examples.inputs, examples.outputs, examples.name
        proto = translate_at_sizes(region, args, list(examples.at_other_sizes))
        onnx.checker.check_model(proto)
        changing = _changing_numbers(region, expected, examples.at_other_sizes)
        module = OrtModule(
            proto.SerializeToString(),
            name=name,
            fixed_inputs={i: a for i, a in enumerate(args) if not isinstance(a, torch.Tensor)},
            output_layouts=_memory_orders(expected),
            **_output_layout(name, expected, len(proto.graph.output), changing),
            **examples.settings,
        )
        got, _ = tree_flatten(module(*args))
        for position, (value, reference) in enumerate(zip(got, tree_flatten(expected)[0])):
            _same_kind(name, position, value, reference)
        return module

    def not_worth_compiling(self, region: GraphModule) -> str | None:
        """A region that does no arithmetic: cheaper in PyTorch than a call into ONNX Runtime."""
        from fxloom.passes.cost import analyze_cost

        try:
            report = analyze_cost(region, mode="recorded")
        except Exception:  # no cost known: lower it and let the measurements speak
            return None
        if report.flops == 0 and not report.not_counted:
            return "no arithmetic, cheaper in PyTorch than a call into ONNX Runtime"
        return None

    def differences(self, region: GraphModule) -> tuple[str, ...]:
        """The approximations ONNX Runtime makes of the region's quantized operators."""
        from fxloom.lower.onnx_ops_quant import approximated

        found = (approximated(node) for node in region.graph.nodes)
        return tuple(dict.fromkeys(why for why in found if why is not None))

    def lowering_settings(
        self, *, whole_model: bool, threads: int | None, spinning: bool | None
    ) -> tuple[dict[str, Any], str | None]:
        """ONNX Runtime's session settings for the regions, and a note saying which.

        When one region covers the model (nothing but its call, guards and unpacking its
        result runs in PyTorch), the sessions get ONNX Runtime's defaults, as torch.onnx + ONNX
        Runtime users have them: spinning worker threads and one thread per physical core
        (measured: ResNet-50 at batch 1 ran 1.23x slower without spinning). Otherwise PyTorch
        runs between the regions, and spinning threads would take the cores its operators
        need (eager ResNet-50 ran 2x slower next to spinning sessions on 2 cores): spinning
        off, and ``torch.get_num_threads()`` threads, so both share the machine alike.
        ``threads`` and ``spinning``, when given, win over the backend's own.
        """
        threads = self.threads if threads is None else threads
        spinning = self.spinning if spinning is None else spinning
        spin = whole_model if spinning is None else spinning
        if whole_model and threads is None:
            count, intra = "ONNX Runtime's default threads", 0
        else:
            number = torch.get_num_threads() if threads is None else threads
            count, intra = f"{number} ONNX Runtime thread{'s' if number != 1 else ''}", threads
        where = "one region covers the model" if whole_model else "PyTorch runs between regions"
        note = f"{where}: {count}, spinning {'on' if spin else 'off'}"
        return {"intra_op_num_threads": intra, "allow_spinning": spin}, note


def _output_layout(
    name: str, expected: Any, computed: int, changing: frozenset[int] = frozenset()
) -> dict[str, Any]:
    """Which of the region's results ONNX computes, and which are Python numbers.

    The translator emits every tensor, and every number that changes with the dynamic sizes
    (``changing``: a size read from a shape) as a 0-d tensor; a number the examples fix is
    folded away and returned as the example's value.
    """
    leaves, spec = tree_flatten(expected)
    numbers = [i for i, leaf in enumerate(leaves) if not isinstance(leaf, torch.Tensor)]
    if computed == len(leaves):
        return {"output_spec": spec, "scalar_outputs": tuple(numbers)}
    if computed == len(leaves) - len(numbers) + len(changing):
        fixed = {i: leaves[i] for i in numbers if i not in changing}
        return {
            "output_spec": spec,
            "scalar_outputs": tuple(sorted(changing)),
            "constant_outputs": fixed,
        }
    raise LoweringError(
        f"{name} returns {len(leaves)} values in PyTorch ({len(numbers)} of them numbers), its "
        f"ONNX model {computed}"
    )


def _changing_numbers(
    region: GraphModule, expected: Any, runs: tuple[SizeRun, ...]
) -> frozenset[int]:
    """Positions, among the region's flattened results, of the numbers the translator emits:
    a result that is one number (not a ``torch.Size``) and changes in the runs at other sizes."""
    (output,) = region.graph.find_nodes(op="output")
    single = not isinstance(output.args[0], tuple)
    nodes = (output.args[0],) if single else output.args[0]
    values = (expected,) if single else expected
    others = [(run.outputs,) if single else run.outputs for run in runs if run.outputs is not None]
    changing, position = set(), 0
    for index, (node, value) in enumerate(zip(nodes, values)):
        is_number = isinstance(node, Node) and node.meta.get("type") in (int, float, bool)
        if is_number and any(not same_number(value, other[index]) for other in others):
            changing.add(position)
        position += len(tree_flatten(value)[0])
    return frozenset(changing)


def _memory_orders(expected: Any) -> dict[int, tuple[int, ...]]:
    """The region's tensor results that PyTorch laid out in another order than row-major
    (a transpose returned as it is), by position, with their dimensions from the largest
    stride to the smallest: the lowered region returns them laid out alike, since what runs
    after it may depend on strides (a ``view`` of a transposed tensor, in exported graphs)."""
    orders = {}
    for position, leaf in enumerate(tree_flatten(expected)[0]):
        if isinstance(leaf, torch.Tensor) and not leaf.is_contiguous():
            order = tuple(sorted(range(leaf.dim()), key=lambda d, t=leaf: (-t.stride(d), d)))
            if order != tuple(range(leaf.dim())):
                orders[position] = order
    return orders


def _same_kind(name: str, position: int, value: Any, reference: Any) -> None:
    if not isinstance(reference, torch.Tensor):
        return
    if value.dtype != reference.dtype or value.shape != reference.shape:
        raise LoweringError(
            f"{name} output {position}: ONNX Runtime gave {value.dtype} {tuple(value.shape)}, "
            f"PyTorch {reference.dtype} {tuple(reference.shape)}"
        )


# Declared in fxloom.backends._BUILT_IN, which enters it in BACKENDS when first asked for:
# importing this module registers nothing.
ONNX_RUNTIME = OnnxRuntimeBackend()
