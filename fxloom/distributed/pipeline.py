"""``fxloom.distributed.pipeline``: a captured program cut into balanced pipeline stages.

Steps (each in its own module of this package):

1. capture the model (``fxloom.passes.captured``: a plain module is traced on the example
   inputs; a GraphModule or an exported program is used as it is, exported ones giving
   operator-level stages);
2. run one microbatch through it with the Interpreter, timing each node and keeping what
   each produced (``costs``);
3. group the nodes into segments at module boundaries and cost each by ``balance``
   (``cuts``, ``costs``);
4. choose the cuts with an exact dynamic program (``cuts.choose_cuts``);
5. make every boundary carry only tensors (``boundaries``), and build one GraphModule per
   stage that keeps the model's parameter names (``stages``);
6. find parameters several stages share and refuse or plan to sync them (``shared``).

The user's model is never modified: the program is traced afresh, or copied. Under
``torch.distributed`` every rank calls ``pipeline`` on its own copy of the model; the cuts
rank 0 chooses are broadcast, so all ranks cut alike even though each times the model itself.

Depends on: ``fxloom.passes`` (captured programs, cost), ``fxloom.interpreter``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch

from fxloom import pytree
from fxloom.distributed import boundaries, costs, cuts
from fxloom.distributed import shared as sharing
from fxloom.distributed.outputs import OutputLayout, needs_layout
from fxloom.distributed.plan import FlopCounter, PipelinePlan, StageReport
from fxloom.distributed.stages import build_stage_modules
from fxloom.distributed.wire import wire_dtype
from fxloom.export.program import ExportedProgram
from fxloom.graph_module import GraphModule
from fxloom.node import Node
from fxloom.ops.runtime_functions import is_runtime_check
from fxloom.passes.captured import call_inputs, model_name, module_to_transform
from fxloom.values.signature import bind

__all__ = ["PipelineError", "pipeline"]

CONSUMER = "fxloom.distributed.pipeline"


class PipelineError(ValueError):
    """The model cannot be cut as asked."""


def pipeline(
    model: Any,
    example_inputs: Any = (),
    *,
    stages: int,
    balance: str | Callable[[Node], float] = "time",
    microbatches: int = 4,
    cut_at: str = "modules",
    shared: str = "sync",
    example_kwargs: dict[str, Any] | None = None,
    bandwidth: float = costs.DEFAULT_BANDWIDTH,
) -> PipelinePlan:
    """Cut ``model`` into ``stages`` pipeline stages of balanced cost.

    Args:
        model: an ``nn.Module`` (traced here on the example inputs), a GraphModule, or an
            ``ExportedProgram`` (``fxloom.export.export``: operator-level stages).
        example_inputs: **one microbatch** of inputs, as stage 0 will receive them: a
            tuple of positional inputs, a dict by name, or one tensor. Stage shapes are
            this microbatch's.
        stages: how many stages (at least 1, at most the number of candidate cuts + 1).
        balance: what to balance: ``"time"`` (each node timed on the example, the default),
            ``"flops"``, ``"memory"`` (bytes allocated plus parameter bytes read), or a
            function ``node -> cost``.
        microbatches: the number of microbatches the schedule will use (recorded in the plan).
        cut_at: ``"modules"`` (cuts only between blocks: layers, top-level children) or
            ``"nodes"`` (between any two nodes).
        shared: for parameters used by several stages (tied embeddings): ``"sync"`` (each
            stage keeps a copy; ``plan.sync_shared_grads`` sums their gradients) or
            ``"error"`` (refuse the plan).
        example_kwargs: more example inputs by name (with positional ``example_inputs``).
        bandwidth: bytes per second between stages, for weighing a cut's traffic.

    Raises:
        PipelineError: more stages than the model has places to cut; a bad argument.
        boundaries.BoundaryError: a value that cannot be sent crosses a chosen cut.
        sharing.SharedParameterError: a shared parameter ``shared`` does not allow.
        Whatever tracing raised, with a note on how to capture the model yourself.
    """
    _check_arguments(stages, microbatches, balance)
    args, kwargs = call_inputs(example_inputs, CONSUMER)
    kwargs.update(example_kwargs or {})
    work = _captured(model, args, kwargs)
    inputs = _placeholder_values(work, args, kwargs)
    with torch.no_grad():
        example = costs.run_example(work, inputs)
    report = costs.cost_report(work)  # FLOPs are reported in every balance mode
    per_node, per_byte = costs.node_costs(balance, work, example, report, bandwidth)
    work_nodes = [n for n in work.graph.nodes if n.op in cuts.WORK_OPS]
    found = cuts.segments(work_nodes, cut_at)
    if stages > len(found):
        raise PipelineError(
            f"{model_name(model)} has {len(found)} places a stage can start ({_blocks(found)}) "
            f"with cut_at={cut_at!r}, so it cannot be cut into {stages} stages: ask for at "
            f"most {len(found)}" + (", or pass cut_at='nodes'" if cut_at == "modules" else "")
        )
    starts = _same_on_every_rank(
        _choose(work, work_nodes, found, per_node, per_byte, example, stages)
    )
    stage_of = _assign(work, work_nodes, starts, stages)
    boundaries.legalise(work.graph, stage_of, example.values, stages)
    received = boundaries.crossings(work.graph, stage_of, stages)
    output = _example_output(work, example)
    layout = OutputLayout.of(output) if needs_layout(output) else None
    dtypes = {n: v.dtype for n, v in example.values.items() if isinstance(v, costs.TensorSpec)}
    modules = build_stage_modules(
        work, stage_of, received, flatten_output=layout is not None, dtypes=dtypes
    )
    shared_rows = _shared(modules, work, shared)
    blocks = dict(zip(work_nodes, cuts.work_blocks(work_nodes)))
    reports = _reports(
        work, stage_of, received, example, FlopCounter(work, report), modules, blocks
    )
    return PipelinePlan(
        stage_modules=modules,
        stages=reports,
        balance=balance if isinstance(balance, str) else getattr(balance, "__name__", "custom"),
        shared=shared_rows,
        microbatches=microbatches,
        input_specs=[_inputs_spec(s, received, example, args, kwargs) for s in range(stages)],
        output_specs=[_outputs_spec(s, received, example, output) for s in range(stages)],
        output_layout=layout,
        example_inputs=args,
        example_kwargs=kwargs,
        timing=f"best of {example.runs} runs at {example.threads} thread"
        f"{'s' if example.threads != 1 else ''}, spread {example.spread:.0%}",
    )


def _check_arguments(count: int, microbatches: int, balance: Any) -> None:
    if not isinstance(count, int) or count < 1:
        raise PipelineError(f"stages={count!r}; give a positive int")
    if not isinstance(microbatches, int) or microbatches < 1:
        raise PipelineError(f"microbatches={microbatches!r}; give a positive int")
    if not callable(balance) and balance not in costs.BALANCES:
        raise PipelineError(
            f"balance={balance!r}; use one of {', '.join(map(repr, costs.BALANCES))} or a "
            "function node -> cost"
        )


def _captured(model: Any, args: tuple, kwargs: dict) -> GraphModule:
    """The program to cut, ours to change: traced afresh, or a copy of the user's graph."""
    examples = kwargs if kwargs and not args else args if not kwargs else None
    if examples is None:  # both: bind positional ones by name
        examples = _bind_by_name(model, args, kwargs)
    program = module_to_transform(model, examples, consumer=CONSUMER)
    if program is model or isinstance(model, (GraphModule, ExportedProgram)):
        graph = copy.deepcopy(program.graph)  # the user's (or the program's) own graph
        return GraphModule(program, graph, class_name=type(program).__name__)
    return program


def _bind_by_name(model: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    forward = model.forward if isinstance(model, torch.nn.Module) else model
    return bind(forward, args, kwargs, defaults=False, partial=True, what="pipeline examples")


def _placeholder_values(work: GraphModule, args: tuple, kwargs: dict) -> list[Any]:
    """The example's value for each placeholder of the program's graph, in order."""
    info = getattr(work.graph._codegen, "pytree_info", None)
    if info is not None:  # an exported module: flatten as its own code does
        bound = bind(work.forward, args, kwargs, what="pipeline examples")
        return list(work.graph.process_inputs(*bound.values()))
    placeholders = [n for n in work.graph.nodes if n.op == "placeholder"]
    values, positional = [], list(args)
    for node in placeholders:
        name = str(node.target).lstrip("*")
        if positional:
            values.append(positional.pop(0))
        elif name in kwargs:
            values.append(kwargs[name])
        elif node.args:
            values.append(node.args[0])  # its default
        else:
            raise PipelineError(
                f"the example inputs give no value for the model's input {name!r}; pass one "
                "(example_inputs as a dict by name, or positionally)"
            )
    return values


def _choose(
    work: GraphModule,
    work_nodes: list[Node],
    found: Sequence[cuts.Segment],
    per_node: dict[Node, float],
    per_byte: float,
    example: costs.Example,
    count: int,
) -> list[int]:
    """The index (in ``work_nodes``) of the first node of each stage after the first."""
    segment_costs = [sum(per_node.get(n, 0.0) for n in work_nodes[s.start : s.stop]) for s in found]
    sent = _bytes_across(work, work_nodes, example)
    sends = [sent[s.stop] * per_byte for s in found[:-1]]
    chosen = cuts.choose_cuts(segment_costs, sends, count)
    return [found[i].start for i in chosen]


def _bytes_across(work: GraphModule, work_nodes: list[Node], example: costs.Example) -> list[int]:
    """Bytes live across each possible cut: before work node i, for i in 0..len."""
    index = {node: i for i, node in enumerate(work_nodes)}
    change = [0] * (len(work_nodes) + 2)
    for node in work.graph.nodes:
        if node.op in ("get_attr", "output"):
            continue
        born = index[node] + 1 if node in index else 0
        last = max((index.get(u, len(work_nodes)) for u in node.users), default=born - 1)
        size = costs.value_bytes(example.values.get(node))
        if last >= born:  # live across cuts born..last
            change[born] += size
            change[last + 1] -= size
    across, running = [], 0
    for delta in change[: len(work_nodes) + 1]:
        running += delta
        across.append(running)
    return across


def _same_on_every_rank(starts: list[int]) -> list[int]:
    """Rank 0's cuts, when this process is one of a group: each rank times the model itself,
    and timings differ, but every rank must cut the model in the same places."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return starts
    chosen = [starts]
    dist.broadcast_object_list(chosen, src=0)
    return chosen[0]


def _assign(
    work: GraphModule, work_nodes: list[Node], starts: list[int], count: int
) -> dict[Node, int]:
    stage_of: dict[Node, int] = {}
    stage, boundaries_left = 0, list(starts)
    index = {node: i for i, node in enumerate(work_nodes)}
    for node in work.graph.nodes:
        if node.op == "placeholder":
            stage_of[node] = 0
        elif node.op == "output":
            stage_of[node] = count - 1
        elif node.op in cuts.WORK_OPS:
            while boundaries_left and index[node] >= boundaries_left[0]:
                boundaries_left.pop(0)
                stage += 1
            stage_of[node] = stage
    return stage_of


def _blocks(found: Sequence[cuts.Segment]) -> str:
    names = [segment.block or "(root)" for segment in found]
    return ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")


def _shared(modules: list[GraphModule], work: GraphModule, policy: str) -> list[Any]:
    rows = sharing.find_shared(modules)
    sharing.check_shared(rows, policy, _updated_in_place(work))
    return rows


def _updated_in_place(work: GraphModule) -> set[str]:
    """Attributes the program updates in place (a BatchNorm's running statistics)."""
    names: set[str] = set()
    for node in work.graph.nodes:
        if node.op == "call_module" and isinstance(work.get_submodule(node.target), _NORMS):
            module = work.get_submodule(node.target)
            if module.training and getattr(module, "track_running_stats", False):
                names.update(f"{node.target}.{b}" for b, _ in module.named_buffers())
        elif node.op != "get_attr" and node.is_impure():
            names.update(str(a.target) for a in node.all_input_nodes if a.op == "get_attr")
    return names


_NORMS = (torch.nn.modules.batchnorm._BatchNorm,)


def _reports(
    work: GraphModule,
    stage_of: dict[Node, int],
    received: list[list[Node]],
    example: costs.Example,
    counter: FlopCounter,
    modules: list[GraphModule],
    blocks: dict[Node, str],
) -> list[StageReport]:
    count = len(received)
    reports = []
    for stage in range(count):
        nodes = [n for n in work.graph.nodes if stage_of.get(n) == stage and n.op in cuts.WORK_OPS]
        named = [n for n in nodes if not _is_check(n) and blocks.get(n)] or nodes
        sent = received[stage + 1] if stage + 1 < count else []
        reports.append(
            StageReport(
                index=stage,
                first=blocks.get(named[0], "") if named else "",
                last=blocks.get(named[-1], "") if named else "",
                nodes=len(nodes),
                parameter_bytes=sum(
                    p.numel() * p.element_size() for p in modules[stage].parameters()
                ),
                seconds=sum(example.seconds.get(n, 0.0) for n in nodes),
                receives=tuple(n.name for n in received[stage]),
                bytes_sent=sum(costs.value_bytes(example.values.get(n)) for n in sent),
                node_names=tuple(n.name for n in nodes),
                counter=counter,
            )
        )
    return reports


def _is_check(node: Node) -> bool:
    return node.op == "call_function" and is_runtime_check(node.target)


def _inputs_spec(
    stage: int,
    received: list[list[Node]],
    example: costs.Example,
    args: tuple,
    kwargs: dict,
) -> tuple[Any, ...]:
    """The example tensors ``stage`` receives: the user's inputs for stage 0."""
    if stage == 0:
        return tuple(a for a in args if isinstance(a, torch.Tensor)) + tuple(
            v for v in kwargs.values() if isinstance(v, torch.Tensor)
        )
    return tuple(_on_wire(example.values[n]) for n in received[stage])


def _on_wire(spec: Any) -> Any:
    """A crossing tensor's spec as it travels (``fxloom.distributed.wire``)."""
    if isinstance(spec, costs.TensorSpec) and wire_dtype(spec.dtype) is not spec.dtype:
        return costs.TensorSpec(spec.shape, wire_dtype(spec.dtype), spec.requires_grad)
    return spec


def _example_output(work: GraphModule, example: costs.Example) -> Any:
    """What the program returned on the example, in its own structure."""
    node = next(n for n in reversed(work.graph.nodes) if n.op == "output")
    return work.graph.process_outputs(example.values.get(node))


def _outputs_spec(
    stage: int, received: list[list[Node]], example: costs.Example, output: Any
) -> tuple[Any, ...]:
    """The tensors ``stage`` returns on the example (the last: its output's tensors).

    Given for every stage, the last included, so that ``PipelineStage`` runs in static mode
    and never runs a stage on uninitialised buffers to infer shapes.
    """
    if stage + 1 < len(received):
        return tuple(_on_wire(example.values[n]) for n in received[stage + 1])
    return tuple(costs.describe(leaf) for leaf in pytree.tensor_leaves(output))
