"""What ``fxloom.distributed.pipeline`` returns: the stage modules, their report, and stages.

``PipelinePlan.stage_modules`` are plain fxloom GraphModules: stage 0 takes the model's
inputs, each other stage the tensors the one before returns, the last returns the model's
output. ``plan.build_stage(rank, device)`` wraps this process's stage in a
``torch.distributed.pipelining.PipelineStage`` with static metadata (the shapes of one
microbatch, from the example run), so any of torch's schedules runs it unchanged::

    plan = fxloom.distributed.pipeline(model, (microbatch,), stages=2)
    print(plan.report)                        # FLOPs, parameters, time, bytes sent, balance
    stage = plan.build_stage(rank, torch.device("cpu"))
    schedule = ScheduleGPipe(stage, n_microbatches=4, loss_fn=loss_fn)
    ...
    plan.sync_shared_grads(stage)             # after backward, if stages share parameters

Stage ``s`` runs on rank ``s % world_size`` (one stage per rank; a looped layout for
interleaved schedules, whose stages ``rank``, ``rank + world_size``, ... are built with
``stage_index``).

Depends on: torch.distributed.pipelining (when a stage is built), rich (for the report).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from fxloom.distributed.costs import TensorSpec
from fxloom.distributed.outputs import OutputLayout
from fxloom.distributed.shared import SharedParameter, sum_gradients
from fxloom.distributed.wire import with_input_gradients
from fxloom.graph_module import GraphModule
from fxloom.passes._cost_report import format_bytes, format_count

__all__ = ["FlopCounter", "PipelinePlan", "StageReport"]


@dataclass(frozen=True)
class StageReport:
    """One stage: where it starts and ends, what it costs, what it sends on."""

    index: int
    first: str  # the block (module path) of its first node
    last: str
    nodes: int
    parameter_bytes: int
    seconds: float  # its nodes' measured forward time on one microbatch
    receives: tuple[str, ...]  # names of the tensors it receives
    bytes_sent: int  # what it sends to the next stage per microbatch
    node_names: tuple[str, ...] = ()
    counter: FlopCounter | None = field(default=None, repr=False, compare=False)

    @property
    def flops(self) -> int:
        """Its nodes' FLOPs on one microbatch (counted when first asked: planning by time
        does not need them)."""
        return self.counter.total(self.node_names) if self.counter is not None else 0


class FlopCounter:
    """FLOPs per node name of a program, from ``analyze_cost`` run once, when first needed."""

    def __init__(self, program: GraphModule, report: Any = None) -> None:
        self._program = program
        self._by_name: dict[str, int] | None = None
        if report is not None:
            self._by_name = {row.name: row.flops for row in report.nodes}

    def total(self, names: tuple[str, ...]) -> int:
        if self._by_name is None:
            from fxloom.distributed.costs import cost_report

            report = cost_report(self._program)
            self._by_name = {row.name: row.flops for row in report.nodes} if report else {}
        return sum(self._by_name.get(name, 0) for name in names)


@dataclass
class PipelinePlan:
    """Stage modules and their report; see the module docstring."""

    stage_modules: list[GraphModule]
    stages: list[StageReport]
    balance: str
    shared: list[SharedParameter]
    microbatches: int
    input_specs: list[tuple[Any, ...]]  # per stage: example inputs (specs), for PipelineStage
    output_specs: list[tuple[Any, ...]]
    output_layout: OutputLayout | None = None
    example_inputs: tuple[Any, ...] = ()
    example_kwargs: dict[str, Any] = field(default_factory=dict)
    timing: str = ""  # how the stages' times were measured: runs, threads, spread
    _groups: dict[int, Any] | None = field(default=None, repr=False)

    # ------------------------------------------------------------------ figures
    @property
    def balance_ratio(self) -> float:
        """The slowest stage's measured time over the mean (1.0 is perfect balance)."""
        times = [stage.seconds for stage in self.stages]
        mean = sum(times) / len(times)
        return max(times) / mean if mean > 0 else 1.0

    @property
    def report(self) -> PlanReport:
        return PlanReport(self)

    # ------------------------------------------------------------------ the output
    def loss(self, loss_fn: Callable[..., Any]) -> Callable[..., Any]:
        """``loss_fn`` taking the model's own output (a ``ModelOutput``, a dict), for a schedule.

        The last stage returns the output's tensors as a tuple (``fxloom.distributed.outputs``);
        the function returned rebuilds the output before calling ``loss_fn(output, target)``.
        For a model returning a tensor it is ``loss_fn`` itself.
        """
        layout = self.output_layout
        if layout is None:
            return loss_fn

        def loss_of_output(output: Any, *rest: Any, **kwargs: Any) -> Any:
            return loss_fn(layout.rebuild(output), *rest, **kwargs)

        loss_of_output.__name__ = getattr(loss_fn, "__name__", "loss")
        return loss_of_output

    def output(self, result: Any) -> Any:
        """The model's output from what the last stage (or ``schedule.step``) returned."""
        return result if self.output_layout is None else self.output_layout.rebuild(result)

    # ------------------------------------------------------------------ running
    def rank_of(self, stage: int, world_size: int) -> int:
        return stage % world_size

    def build_stage(
        self,
        rank: int,
        device: torch.device | str = "cpu",
        group: Any | None = None,
        *,
        stage_index: int | None = None,
        backend: str | Any = "eager",
        training: bool = True,
    ) -> Any:
        """This rank's ``PipelineStage`` (``stage_index`` picks one when a rank has several).

        ``backend`` compiles the stage module (``fxloom.backends``: ``"eager"`` runs it as it
        is; ``"onnxruntime"`` runs it in one ONNX Runtime session, at the example's shapes).
        ``training=False`` allows backends that cannot run backward (schedules without a loss).
        """
        import torch.distributed as dist
        from torch.distributed.pipelining import PipelineStage

        world_size = dist.get_world_size(group)
        index = rank if stage_index is None else stage_index
        if not 0 <= index < len(self.stage_modules):
            raise ValueError(
                f"build_stage: stage {index} does not exist; the plan has "
                f"{len(self.stage_modules)} stages (0..{len(self.stage_modules) - 1})"
            )
        if self.rank_of(index, world_size) != rank:
            raise ValueError(
                f"build_stage: stage {index} runs on rank {self.rank_of(index, world_size)} "
                f"of {world_size}, not rank {rank}"
            )
        if len(self.stage_modules) < world_size:
            raise ValueError(
                f"build_stage: {world_size} processes but only {len(self.stage_modules)} "
                "stages; plan as many stages as processes (or a multiple, for looped schedules)"
            )
        self._make_groups(world_size, group)
        device = torch.device(device)
        inputs = _materialise(self.input_specs[index], device)
        examples = tuple(  # stage 0 gets the example itself; the others, zeros of its shapes
            t.detach().clone() if index == 0 else torch.zeros_like(t, requires_grad=False)
            for t in inputs
        )
        module = _compiled(self.stage_modules[index].to(device), examples, backend, training)
        if training and index > 0:
            module = with_input_gradients(module)
        return PipelineStage(
            module,
            index,
            len(self.stage_modules),
            device,
            input_args=inputs if index else inputs[: self._positional_tensors()],
            output_args=_materialise(self.output_specs[index], device),
            group=group,
        )

    def _positional_tensors(self) -> int:
        """How many of stage 0's inputs the schedule passes positionally (``step(*args)``):
        the example's positional tensors. Inputs given by name reach stage 0 as keywords,
        which torch.distributed.pipelining does not count among a stage's declared inputs
        (it checks them under ``TORCH_DISTRIBUTED_DEBUG=DETAIL``)."""
        return sum(isinstance(a, torch.Tensor) for a in self.example_inputs)

    def _make_groups(self, world_size: int, group: Any | None) -> None:
        """One process group per shared set spanning several ranks; every rank makes them all."""
        if self._groups is not None:
            return
        import torch.distributed as dist

        self._groups = {}
        for number, row in enumerate(self.shared):
            ranks = sorted({self.rank_of(stage, world_size) for stage in row.stages})
            if len(ranks) > 1 and row.is_parameter:
                if group is not None:
                    ranks = [dist.get_global_rank(group, r) for r in ranks]
                self._groups[number] = dist.new_group(ranks)

    def sync_shared_grads(self, stages: Any) -> None:
        """Sum the gradients of parameters several stages share; call after backward.

        ``stages``: this rank's ``PipelineStage`` or a list of them (or stage modules by
        index: ``{index: module}``). Every rank must call it, holding shared parameters or not.
        """
        local = _local_modules(stages)
        groups = self._groups or {}
        for number, row in enumerate(self.shared):
            if not row.is_parameter:
                continue
            if set(row.stages) & set(local):  # only the ranks holding it reduce
                sum_gradients(row, local, groups.get(number))


def _compiled(
    module: GraphModule, inputs: tuple[torch.Tensor, ...], backend: Any, training: bool
) -> torch.nn.Module:
    """``module`` compiled by ``backend``; refused when training needs a backward it lacks."""
    from fxloom.backends import get_backend

    chosen = get_backend(backend)
    if training and not chosen.trainable:
        raise ValueError(
            f"build_stage: backend {chosen.name!r} cannot run backward, so its stages cannot "
            "train; pass training=False for a schedule without a loss (inference), or use "
            "backend='eager'"
        )
    if chosen.name == "eager":
        return module
    return chosen.compile(module, inputs)


def _local_modules(stages: Any) -> dict[int, torch.nn.Module]:
    if isinstance(stages, dict):
        return dict(stages)
    items = stages if isinstance(stages, (list, tuple)) else [stages]
    return {stage.stage_index: stage.submod for stage in items}


def _materialise(specs: tuple[Any, ...], device: torch.device) -> tuple[torch.Tensor, ...]:
    """Example tensors for static stage metadata: floating ones require grad, as received
    activations and stage outputs do when training (PipelineStage copies the flag). Every
    tensor that crosses a cut is floating (``fxloom.distributed.wire``)."""
    tensors = (
        spec.empty(device) if isinstance(spec, TensorSpec) else spec.detach().to(device)
        for spec in specs
    )
    return tuple(t.requires_grad_(t.is_floating_point()) for t in tensors)


class PlanReport:
    """The plan as a rich table (``rich.print(plan.report)``) or plain text (``str``)."""

    def __init__(self, plan: PipelinePlan) -> None:
        self.plan = plan

    def table(self) -> Any:
        from rich.table import Table

        plan = self.plan
        table = Table(
            title=f"pipeline: {len(plan.stages)} stages, balanced by {plan.balance}; "
            f"balance (max/mean time) {plan.balance_ratio:.2f}"
            + (f"; times: {plan.timing}" if plan.timing else ""),
            title_justify="left",
        )
        for column in ("stage", "modules", "nodes", "FLOPs", "params", "time ms", "sends"):
            table.add_column(
                column, justify="left" if column == "modules" else "right", no_wrap=True
            )
        for stage in plan.stages:
            span = stage.first if stage.first == stage.last else f"{stage.first} .. {stage.last}"
            table.add_row(
                str(stage.index),
                span or "(root)",
                str(stage.nodes),
                format_count(stage.flops),
                format_bytes(stage.parameter_bytes),
                f"{stage.seconds * 1e3:.2f}",
                format_bytes(stage.bytes_sent) if stage.index < len(plan.stages) - 1 else "-",
            )
        return table

    def __rich__(self) -> Any:
        return self.table()

    def __str__(self) -> str:
        from rich.console import Console

        console = Console(width=120, record=True, file=_Discard())
        console.print(self.table())
        for row in self.plan.shared:
            console.print(f"shared: {row.describe()}")
        return console.export_text().rstrip()


class _Discard:
    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass
