"""``ExportedProgram``: an exported graph with its signature, its state and how to call it.

The graph takes every input flat — parameters, buffers, constants, then the
user's tensors — and returns the state it writes, then the user's outputs
(``graph_signature`` says which is which). ``module()`` turns that back into
an ordinary module: state becomes attributes again, writes become ``copy_``
into them, and the forward takes and returns the structures the program was
exported with::

    >>> import torch
    >>> from fxloom.export import export
    >>> ep = export(torch.nn.Linear(3, 2), (torch.randn(4, 3),))
    >>> [str(s) for s in ep.graph_signature.input_specs]
    ["p_weight: PARAMETER target='weight'", "p_bias: PARAMETER target='bias'", 'input_1: USER_INPUT']
    >>> ep.module()(torch.ones(4, 3)).shape
    torch.Size([4, 2])

Depends on the IR, ``fxloom.pytree_codegen``, ``signature`` and ``input_checks``.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from typing import Any

import torch

from fxloom import attr_path
from fxloom.export.input_checks import ExportedCodeGen, add_input_checks
from fxloom.export.signature import STATE_KINDS, ExportGraphSignature, InputKind, OutputKind
from fxloom.graph import Graph
from fxloom.graph_module import GraphModule
from fxloom.node import Node
from fxloom.pytree import TreeSpec
from fxloom.pytree_codegen import PyTreeInfo

__all__ = ["ExportedProgram"]

aten = torch.ops.aten

_WRITES = {
    OutputKind.BUFFER_MUTATION,
    OutputKind.PARAMETER_MUTATION,
    OutputKind.USER_INPUT_MUTATION,
}


class ExportedProgram:
    """The result of ``fxloom.export.export``; see the module docstring."""

    def __init__(
        self,
        graph_module: GraphModule,
        graph_signature: ExportGraphSignature,
        state_dict: dict[str, torch.Tensor],
        constants: dict[str, torch.Tensor],
        *,
        in_spec: TreeSpec,
        out_spec: TreeSpec,
        arg_names: list[str],
        example_inputs: tuple[tuple, dict] | None = None,
        range_constraints: dict[Any, Any] | None = None,
        verifier: Callable[[ExportedProgram], None] | None = None,
        module_hierarchy: dict[str, type] | None = None,
        shape_env: Any = None,
        shape_constraints: list[str] | None = None,
    ) -> None:
        self.graph_module = graph_module
        self.graph_signature = graph_signature
        self.state_dict = state_dict
        self.constants = constants
        self.in_spec = in_spec  # of the tuple of forward's parameters, bound
        self.out_spec = out_spec
        self.arg_names = arg_names  # forward's parameter names, in order
        self.example_inputs = example_inputs
        self.range_constraints = range_constraints or {}
        self.verifier = verifier
        # The source model's modules, {path: class} in named_modules order ("" the root,
        # a module registered twice under both names):
        # unflatten rebuilds this tree, modules that ran no operator included.
        self.module_hierarchy = module_hierarchy or {}
        # The symbols of the sizes in meta["val"] (a ShapeEnv), for passes that capture again.
        self.shape_env = shape_env
        # What export derived about the input sizes, one line each (``shape_report``).
        self.shape_constraints = shape_constraints or []
        if verifier is not None:
            verifier(self)

    @property
    def graph(self) -> Graph:
        return self.graph_module.graph

    @property
    def call_spec(self) -> tuple[TreeSpec, TreeSpec]:
        return self.in_spec, self.out_spec

    def tensor_of(self, spec_target: str, kind: InputKind) -> torch.Tensor:
        """The value of a lifted input: ``state_dict`` for parameters and persistent buffers."""
        if kind is InputKind.CONSTANT_TENSOR or spec_target not in self.state_dict:
            return self.constants[spec_target]
        return self.state_dict[spec_target]

    def size_ranges(self) -> dict[Any, tuple[int, int | None, str | None]]:
        """Each symbol of ``range_constraints``: ``(min, max or None, the user's Dim name)``,
        what the exported module checks the inputs' sizes against."""
        symbols = self.shape_env.symbols if self.shape_env is not None else {}
        ranges = {}
        for symbol, value_range in self.range_constraints.items():
            info = symbols.get(symbol)
            upper = value_range.upper
            ranges[symbol] = (
                int(value_range.lower) if value_range.lower != float("-inf") else None,
                None if upper == float("inf") else int(upper),
                info.dim_name if info is not None else None,
            )
        return ranges

    def validate(self) -> None:
        """Check the Export IR's rules again (after editing the graph by hand, say)."""
        if self.verifier is not None:
            self.verifier(self)

    def run_decompositions(self, table: dict[Any, Any] | None = None) -> ExportedProgram:
        """A new program with the operators in ``table`` (default: torch's core ATen set)
        replaced by their decompositions; see ``fxloom.export.decompose``."""
        from fxloom.export.decompose import run_decompositions

        return run_decompositions(self, table)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            "an ExportedProgram is not called directly: call ep.module()(...), which takes the "
            "inputs as the program was exported"
        )

    # ---------------------------------------------------------------- module
    def module(self) -> GraphModule:
        """An ``nn.Module`` running the program: state as attributes, writes applied in place.

        Calling it with inputs of another structure, shape or dtype than the
        export's examples raises an error naming the input.
        """
        graph = Graph()
        values: dict[Node, Any] = {}
        root = torch.nn.Module()
        placeholders = {}
        for node, spec in zip(self.graph.find_nodes(op="placeholder"), self._input_specs()):
            if spec.kind in STATE_KINDS:
                tensor = self.tensor_of(spec.target, spec.kind)
                buffer = spec.kind is InputKind.BUFFER
                attr_path.install(
                    root,
                    spec.target,
                    tensor,
                    as_buffer=buffer,
                    persistent=spec.persistent is not False,
                )
                continue
            placeholders[node] = new = graph.placeholder(node.name)
            new.meta = dict(node.meta)
            values[node] = new
        add_input_checks(graph, placeholders, self.size_ranges())
        for node, spec in zip(self.graph.find_nodes(op="placeholder"), self._input_specs()):
            if spec.kind in STATE_KINDS:
                values[node] = get = graph.get_attr(spec.target)
                get.meta = dict(node.meta)
        output = None
        for node in self.graph.nodes:
            if node.op == "placeholder":
                continue
            if node.op == "output":
                output = node
                break
            values[node] = graph.node_copy(node, values.__getitem__)
        results = list(output.args[0]) if output is not None else []
        user_outputs = []
        for spec, result in zip(self.graph_signature.output_specs, results):
            value = values[result] if isinstance(result, Node) else result
            if spec.kind in _WRITES:
                target = (
                    graph.get_attr(spec.target)
                    if spec.kind is not OutputKind.USER_INPUT_MUTATION
                    else values[_placeholder_named(self.graph, spec.target)]
                )
                graph.call_function(aten.copy_.default, (target, value))
            else:
                user_outputs.append(value)
        graph.output(tuple(user_outputs))
        graph.set_codegen(ExportedCodeGen(PyTreeInfo(self.arg_names, self.in_spec, self.out_spec)))
        graph.constants.update(self.graph.constants)  # cond's branches (fxloom.cond)
        gm = GraphModule(root, graph, class_name="ExportedModule")
        gm._in_spec, gm._out_spec = self.in_spec, self.out_spec
        return gm

    def _input_specs(self) -> list[Any]:
        return self.graph_signature.input_specs

    # ---------------------------------------------------------------- printing
    def __str__(self) -> str:
        code = _code_with_branches(self.graph_module)
        return (
            "ExportedProgram:\n"
            + textwrap.indent(code.rstrip(), "    ")
            + "\n\nGraph signature:\n"
            + textwrap.indent(str(self.graph_signature), "    ")
            + f"\nRange constraints: {self.range_constraints}\n"
            + "".join(f"Shape constraint: {line}\n" for line in self.shape_constraints)
        )

    def __repr__(self) -> str:
        return (
            f"ExportedProgram({len(self.graph.nodes)} nodes, "
            f"{len(self.graph_signature.input_specs)} inputs, "
            f"{len(self.graph_signature.output_specs)} outputs)"
        )


def _placeholder_named(graph: Graph, name: str) -> Node:
    for node in graph.find_nodes(op="placeholder"):
        if node.name == name:
            return node
    raise KeyError(name)


def _code_with_branches(gm: torch.nn.Module) -> str:
    """The graph's code, then each subgraph it reads (a branch of cond) as a nested class."""
    code = gm.graph.python_code("self", verbose=True).src.rstrip()
    for node in gm.graph.find_nodes(op="get_attr"):
        branch = getattr(gm, node.target, None)
        if isinstance(getattr(branch, "graph", None), Graph):
            body = textwrap.indent(_code_with_branches(branch), "    ")
            code += f"\n\nclass {node.target}(torch.nn.Module):\n{body}"
    return code
